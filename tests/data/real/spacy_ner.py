"""spaCy v3's training CLI, `spacy train` (explosion/spaCy, spacy/cli/train.py and spacy/training/loop.py; the
table printed by spacy/training/loggers.py, `spacy.ConsoleLogger.v1`; spaCy 3.8.18 from PyPI), on the config that
`spacy init config --lang en --pipeline ner` writes (tok2vec + ner, CPU, optimize for efficiency). After the
pipeline's set-up lines, the logger prints a table: its header and rule once, then a row per evaluation, the
losses summed over the steps since the last row, with 2 decimals:

    E    #       LOSS TOK2VEC  LOSS NER  ENTS_F  ENTS_P  ENTS_R  SCORE
    ---  ------  ------------  --------  ------  ------  ------  ------
      0       0          0.00     62.00    1.42    4.35    0.85    0.01
      0      10          1.21    744.40    0.00    0.00    0.00    0.00

(the header ends in a space; the lines before the table, `ℹ Using CPU`, `✔ Initialized pipeline`, the
`=== Training pipeline ===` rule, are coloured by wasabi with ANSI codes even in a file; the rows are not).

Changes:
- a small synthetic NER corpus (spaCy ships none; nothing can be downloaded here): 1500 training and 100
  development sentences from 12 templates ("Kalomi Renta flew from Vozu to Bagorstan yesterday ."), entities
  PERSON, GPE and ORG named by random syllables, a tenth of them mislabelled (so the loss does not reach 0),
  written as DocBin files (train.spacy, dev.spacy) in a temporary folder, with the config;
- the config as `spacy init config` writes it but for `training.eval_frequency` 10 (init config: 200) and
  `training.max_steps` 490 (20000), so that the table has 50 rows and a run takes well under 2 minutes, and
  `training.logger`, which is `corpus.TruthLogger.v1`: spaCy's own `spacy.ConsoleLogger.v1` (same settings,
  progress_bar false) wrapped so that, before each row is printed, the losses dict the logger gets (at full
  precision) and the row's epoch and step are noted; at the end they are written as the truth sidecar
  (RUN.truth.json beside this file, RUN from the CORPUS_RUN variable);
- CORPUS_INJECT=nan:STEP (STEP: spaCy's step, the `#` column, 0-based): `training.before_update` is
  `corpus.Inject.v1`, which before the update of step STEP sets the embedding table of the tok2vec's NORM
  HashEmbed to NaN, so every later tok2vec and ner loss is NaN (spaCy does not stop on NaN: it goes on training
  and printing rows of `nan`, its scores 0.00; thinc warns once on stderr, `RuntimeWarning: All-NaN slice
  encountered`, two lines before the first NaN row);
- 1 thread (OMP_NUM_THREADS etc.).
This file is both the driver (run as a script: it writes the data and the config, then runs
`python -m spacy train CONFIG --code THIS_FILE --paths.train ... --paths.dev ...` with stdout and stderr inherited)
and the `--code` file that registers the logger and the callback.

    cd tests/data/real
    CORPUS_RUN=spacy_ner PYTHONUNBUFFERED=1 VENV/bin/python spacy_ner.py > spacy_ner.log 2>&1
    CORPUS_RUN=spacy_ner.nan CORPUS_INJECT=nan:295 PYTHONUNBUFFERED=1 VENV/bin/python spacy_ner.py \\
        > spacy_ner.nan.log 2>&1

The truth's training loss is the table's first loss column, `LOSS TOK2VEC` (the reader's `tok2vec_loss`):
`loss` is info["losses"]["tok2vec"] (the sum since the last row; the `LOSS NER` column's values are kept in the
sidecar's `ner_loss` list, one per row, not as training-loss rows), `epoch` the `E` column, `step` and `global`
the `#` column. The scores (ENTS_F, ENTS_P, ENTS_R, SCORE) are neither losses nor evaluation losses: no
`evaluations`. `inject.print` is the index of the first row whose losses include a step from STEP on.
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json
import random
import shutil
import subprocess
import sys
import tempfile

import numpy
import spacy
from spacy.tokens import DocBin
from spacy.util import registry

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "spacy_ner")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)


@registry.loggers("corpus.TruthLogger.v1")
def truth_logger(progress_bar: bool = False):
    console = registry.get("loggers", "spacy.ConsoleLogger.v1")(progress_bar=progress_bar)  # spacy-legacy

    def setup_printer(nlp, stdout=sys.stdout, stderr=sys.stderr):
        log_step, finalize = console(nlp, stdout, stderr)
        printed = []
        ner_losses = []

        def corpus_log_step(info):
            if info is not None:
                printed.append(
                    {"epoch": info["epoch"], "step": info["step"], "global": info["step"],
                     "loss": float(info["losses"]["tok2vec"])}
                )
                ner_losses.append(float(info["losses"]["ner"]))
            log_step(info)

        def corpus_finalize():
            finalize()
            first_after = None
            if INJECT:
                first_after = next(i for i, row in enumerate(printed) if row["step"] >= INJECT_STEP)
            truth = {
                "script": "spacy_ner.py",
                "source": "explosion/spaCy spacy train (spacy/cli/train.py, spacy/training/loggers.py "
                "ConsoleLogger.v1), config from spacy init config --lang en --pipeline ner",
                "framework": f"spaCy {spacy.__version__}",
                "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
                "tolerance": 0.005,
                "printed": printed,
                "ner_loss": ner_losses,
            }
            with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
                json.dump(truth, f, indent=1)
                f.write("\n")

        return corpus_log_step, corpus_finalize

    return setup_printer


@registry.callbacks("corpus.Inject.v1")
def make_inject():
    def inject(nlp, args):
        if KIND == "nan" and args["step"] == INJECT_STEP:
            model = nlp.get_pipe("tok2vec").model
            embed = next(node for node in model.walk() if node.name.startswith("hashembed"))
            table = embed.get_param("E")
            embed.set_param("E", embed.ops.xp.full(table.shape, numpy.nan, dtype=table.dtype))

    return inject


SYLLABLES = ["ka", "lo", "mi", "ren", "ta", "vo", "sha", "dri", "el", "on", "ba", "zu", "pe", "gor", "ni", "ax"]
DAYS = ["Monday", "Tuesday", "Friday", "last week", "yesterday", "in May", "on Sunday"]
TEMPLATES = [
    "{PERSON} flew from {GPE} to {GPE} {day} .",
    "{PERSON} joined {ORG} in {GPE} .",
    "{ORG} opened an office in {GPE} {day} .",
    "{day} , {PERSON} met {PERSON} at {ORG} .",
    "The mayor of {GPE} thanked {PERSON} .",
    "{PERSON} works for {ORG} and lives in {GPE} .",
    "Shares of {ORG} fell after {PERSON} resigned .",
    "We visited {GPE} with {PERSON} {day} .",
    "{GPE} and {ORG} signed a deal {day} .",
    "According to {PERSON} , {ORG} will leave {GPE} .",
    "Talks between {GPE} and {GPE} ended {day} .",
    "{PERSON} said {ORG} expects growth .",
]
SUFFIX = {"GPE": ["", "", "ia", "burg", "stan"], "ORG": [" Corp", " Inc", " Group", " Labs", ""], "PERSON": [""]}


def name(rng, label):
    def word():
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()

    if label == "PERSON":
        return f"{word()} {word()}"
    return word() + rng.choice(SUFFIX[label])


def make_docs(nlp, n, rng, noise=0.1):
    """Template sentences whose names are made of random syllables (so most are new words); a tenth of the
    entities carry a wrong label (GPE and ORG swapped, PERSON dropped), so the loss does not reach 0."""
    docs = []
    for _ in range(n):
        words, ents = [], []
        for part in rng.choice(TEMPLATES).split():
            if part in ("{PERSON}", "{GPE}", "{ORG}"):
                label = part[1:-1]
                start = len(words)
                words.extend(name(rng, label).split())
                if rng.random() < noise:
                    label = {"GPE": "ORG", "ORG": "GPE", "PERSON": None}[label]
                if label:
                    ents.append((start, len(words), label))
            elif part == "{day}":
                words.extend(rng.choice(DAYS).split())
            else:
                words.append(part)
        words[0] = words[0][0].upper() + words[0][1:]
        doc = spacy.tokens.Doc(nlp.vocab, words=words)
        doc.ents = [doc.char_span(doc[s].idx, doc[e - 1].idx + len(doc[e - 1]), label=l) for s, e, l in ents]
        docs.append(doc)
    return docs


def main():
    from spacy.cli.init_config import init_config

    work = tempfile.mkdtemp(prefix="spacy_ner_")
    nlp = spacy.blank("en")
    rng = random.Random(0)
    DocBin(docs=make_docs(nlp, 1500, rng)).to_disk(os.path.join(work, "train.spacy"))
    DocBin(docs=make_docs(nlp, 100, rng)).to_disk(os.path.join(work, "dev.spacy"))

    config = init_config(lang="en", pipeline=["ner"], optimize="efficiency", gpu=False)  # `spacy init config`
    config["training"]["eval_frequency"] = 10
    config["training"]["max_steps"] = 490
    config["training"]["logger"]["@loggers"] = "corpus.TruthLogger.v1"
    if INJECT:
        config["training"]["before_update"] = {"@callbacks": "corpus.Inject.v1"}
    config.to_disk(os.path.join(work, "config.cfg"))

    cmd = [sys.executable, "-m", "spacy", "train", os.path.join(work, "config.cfg"),
           "--code", os.path.abspath(__file__),
           "--paths.train", os.path.join(work, "train.spacy"), "--paths.dev", os.path.join(work, "dev.spacy")]
    rc = subprocess.call(cmd)
    shutil.rmtree(work)
    sys.exit(rc)


if __name__ == "__main__":
    main()
