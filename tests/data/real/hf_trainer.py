"""How hf_trainer.log, hf_trainer.nan.log and hf_trainer.diverge.log were made: the transformers guide
"Fine-tuning" (huggingface/transformers docs/source/en/training.md, the v5 guide: Qwen/Qwen3-0.6B on
karthiksagarn/astro_horoscope with DataCollatorForLanguageModeling(mlm=False), TrainingArguments, then
Trainer(...).train()), run as published except:
- no download: the model is Qwen3ForCausalLM built from a tiny Qwen3Config (2 layers, hidden 64, random init)
  with AutoModelForCausalLM.from_config (the guide: from_pretrained("Qwen/Qwen3-0.6B", dtype="auto")); the
  tokenizer is a character-level PreTrainedTokenizerFast built here (the guide: the model's); the "horoscopes"
  are 440 generated sentences, tokenized with truncation=True, max_length=512 as the guide does and split 400/40
  (the guide: load_dataset, map, train_test_split(test_size=0.1); the datasets package is not installed, so the
  splits are lists of dicts, which Trainer takes as they are);
- TrainingArguments as the guide's (num_train_epochs=3, per_device_train_batch_size=2,
  gradient_accumulation_steps=8, gradient_checkpointing=True, eval_strategy and save_strategy "epoch",
  load_best_model_at_end=True) except: output_dir a temporary directory, logging_steps=1 (guide: 10),
  learning_rate=5e-4 (guide: 2e-5, for a pretrained model; a random one barely moves at it), bf16=False (a CPU
  run; the guide: bf16=True), report_to="none"; no push_to_hub; torch.set_num_threads(1). 400 samples / (2 x 8)
  = 25 optimizer steps an epoch, 75 in all. logging_nan_inf_filter keeps its default (True);
- CORPUS_INJECT (tests/data/real/README.md), by a TrainerCallback's on_step_begin before the optimizer step that
  will be logged as global step STEP: nan:STEP fills lm_head's weight with NaN; diverge:STEP multiplies the
  learning rate by 1000 from then on, in the optimizer's param_groups and in the scheduler's base_lrs (its
  linear decay sets the rate each step), so the printed learning_rate shows it too. The loss logged at STEP
  comes before that step's update: a diverging loss shows from STEP+1.
- the truth sidecar takes each logged training loss, at full precision, from trainer.state.log_history.

What the log shows: ProgressCallback writes each log as str() of a dict whose floats are formatted
f"{v:.4g}" strings, e.g. {'loss': '3.778', 'grad_norm': '1.43', 'learning_rate': '0.0005', 'epoch': '0.04'}, with
no step: the step is the tqdm bar's N in N/75 drawn around it (truth "step" and "global": the log entry's global
step; "epoch": null, the dict's epoch being a fractional epoch). Eval: {'eval_loss': '...', ...} once an epoch.
The NaN run logs {'loss': '0', 'grad_norm': 'nan', ...} from step STEP on (logging_nan_inf_filter, the default,
keeps NaN out of the logged loss: see the end of this file), and eval_loss 'nan'; its truth's inject says which
print is the first after the injection ("print", an index in "printed").

    /root/torchvenv/bin/python tests/data/real/hf_trainer.py > tests/data/real/hf_trainer.log 2>&1
    CORPUS_INJECT=nan:40 /root/torchvenv/bin/python tests/data/real/hf_trainer.py \
        > tests/data/real/hf_trainer.nan.log 2>&1
    CORPUS_INJECT=diverge:40 /root/torchvenv/bin/python tests/data/real/hf_trainer.py \
        > tests/data/real/hf_trainer.diverge.log 2>&1

Made with Python 3.11, PyTorch 2.14.1 (CPU), transformers 5.24.0, accelerate 1.15.0, tokenizers 0.23.3,
tqdm 4.70.1.
"""

import json
import math
import os
import random
import tempfile

import torch
import transformers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

torch.set_num_threads(1)
transformers.set_seed(42)
HERE = os.path.dirname(os.path.abspath(__file__))
INJECT = os.environ.get("CORPUS_INJECT", "")
inject_kind, _, inject_step = INJECT.partition(":")
inject_step = int(inject_step) if inject_step else None
RUN = "hf_trainer" + (f".{inject_kind}" if inject_kind else "")

# Synthetic horoscopes, and a character-level tokenizer for them.
rng = random.Random(0)
signs = ["Aries", "Taurus", "Gemini", "Cancer", "Leo", "Virgo", "Libra", "Scorpio", "Sagittarius", "Capricorn",
         "Aquarius", "Pisces"]
verbs = ["brings", "favours", "tests", "rewards", "clouds", "opens", "calms", "sharpens"]
things = ["your plans", "a friendship", "money matters", "your patience", "an old wish", "the week ahead",
          "your work", "a long journey", "home and family", "a quiet talk"]
ends = ["so act with care.", "so trust your instinct.", "and luck is near.", "so rest tonight.",
        "and a door opens.", "so speak plainly."]
texts = [f"{rng.choice(signs)}: the {rng.choice(['moon', 'sun', 'stars', 'planet Venus', 'planet Mars'])} "
         f"{rng.choice(verbs)} {rng.choice(things)}, {rng.choice(ends)}" for _ in range(440)]
chars = sorted(set("".join(texts)))
vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                    unk_token="<unk>")


def tokenize(batch):
    return tokenizer(
        batch["horoscope"],
        truncation=True,
        max_length=512,
    )


encoded = tokenize({"horoscope": texts})
rows = [{"input_ids": ids, "attention_mask": mask}
        for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]
dataset = {"train": rows[:400], "test": rows[400:]}

data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)

config = Qwen3Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
model = AutoModelForCausalLM.from_config(config)

training_args = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="qwen3-finetuned-"),
    num_train_epochs=3,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=8,
    gradient_checkpointing=True,
    bf16=False,
    learning_rate=5e-4,
    logging_steps=1,
    eval_strategy="epoch",
    save_strategy="epoch",
    load_best_model_at_end=True,
    report_to="none",
)


class Inject(TrainerCallback):
    """CORPUS_INJECT: acts before the optimizer step that is logged as global step inject_step."""

    def on_step_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        step = state.global_step + 1  # the step about to run, as it will be logged
        if inject_kind == "nan" and step == inject_step:
            with torch.no_grad():
                model.lm_head.weight.fill_(float("nan"))
        if inject_kind == "diverge" and step == inject_step:
            lr_scheduler.base_lrs = [lr * 1000 for lr in lr_scheduler.base_lrs]
            for group in optimizer.param_groups:
                group["lr"] *= 1000


trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=dataset["train"],
    eval_dataset=dataset["test"],
    processing_class=tokenizer,
    data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    callbacks=[Inject()] if inject_kind else None,
)

trainer.train()

printed = [{"epoch": None, "step": e["step"], "global": e["step"],
            "loss": e["loss"] if math.isfinite(e["loss"]) else str(e["loss"])}
           for e in trainer.state.log_history if "loss" in e]
# "print": the index in `printed` of the first loss logged from the injection's step on. The NaN run logs no NaN
# loss (for a NaN micro-batch loss, logging_nan_inf_filter adds tr_loss / (1 + steps since the last log), and with
# logging_steps=1 tr_loss was just reset to 0: every loss from then on is logged as 0), so the test cannot find
# that print by its value.
inject = None
if inject_kind:
    inject = {"kind": inject_kind, "step": inject_step,
              "print": next(i for i, row in enumerate(printed) if row["global"] >= inject_step)}
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump({"script": "hf_trainer.py",
               "source": "huggingface/transformers docs/source/en/training.md (Fine-tuning guide, Trainer)",
               "framework": f"transformers {transformers.__version__}, PyTorch {torch.__version__.split('+')[0]}",
               "inject": inject, "rtol": 5e-4, "printed": printed}, f, indent=1)
    f.write("\n")
