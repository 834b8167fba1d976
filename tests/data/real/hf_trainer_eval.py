"""How hf_trainer_eval.log was made: hf_trainer.py (the transformers guide "Fine-tuning", Trainer on a tiny
random Qwen3 and synthetic horoscopes: its docstring lists what differs from the guide) with its steps fast enough
that tqdm draws the training bar at most every 0.1 s (mininterval) and not at every step, and a log that comes
right after an evaluation:
- 604 horoscopes split 404/200 (hf_trainer.py: 400/40), per_device_train_batch_size=4 and no gradient
  accumulation (hf_trainer.py: 2 and 8, as the guide), gradient_checkpointing=False: 101 optimizer steps an
  epoch, 303 in all; the evaluation each epoch (eval_strategy="epoch", as the guide) is 25 batches of 8;
- logging_steps=3 (the guide: 10), so that the logs at steps 102 and 204 come one and two steps after an
  evaluation, before the training bar is drawn again;
- no CORPUS_INJECT: only a healthy run;
- the truth sidecar takes each logged training loss, at full precision, from trainer.state.log_history.

What the log shows: as hf_trainer.py says, each log a dict of f"{v:.4g}" strings with no step, written with
tqdm.write over the training bar (which tqdm redraws right after it, at the step reached); `epoch` is the
fractional epoch, global_step / 101 (truth "step" and "global": the log entry's global step; "epoch": null).
Each evaluation draws its own bar (25/25) under the training bar, prints {'eval_loss': ...}, and the checkpoint
save draws `Writing model shards`; the run ends with {'train_runtime': ..., 'train_loss': ..., 'epoch': '3'}.

    cd tests/data/real
    PYTHONUNBUFFERED=1 /tmp/venv-torch/bin/python hf_trainer_eval.py > hf_trainer_eval.log 2>&1

PYTHONUNBUFFERED=1 as tfrun sets it for a job (runner/scheduler.py): tqdm.write prints to stdout, the bars to
stderr. Made with Python 3.11, PyTorch 2.14.1 (CPU), transformers 5.24.0, accelerate 1.16.0, tokenizers 0.23.3,
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
    TrainingArguments,
)

torch.set_num_threads(1)
transformers.set_seed(42)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = "hf_trainer_eval"

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
         f"{rng.choice(verbs)} {rng.choice(things)}, {rng.choice(ends)}" for _ in range(604)]
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
dataset = {"train": rows[:404], "test": rows[404:]}

data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)

config = Qwen3Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
model = AutoModelForCausalLM.from_config(config)

training_args = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="qwen3-finetuned-"),
    num_train_epochs=3,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    gradient_checkpointing=False,
    bf16=False,
    learning_rate=5e-4,
    logging_steps=3,
    eval_strategy="epoch",
    save_strategy="epoch",
    load_best_model_at_end=True,
    report_to="none",
)


trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=dataset["train"],
    eval_dataset=dataset["test"],
    processing_class=tokenizer,
    data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
)

trainer.train()

printed = [{"epoch": None, "step": e["step"], "global": e["step"],
            "loss": e["loss"] if math.isfinite(e["loss"]) else str(e["loss"])}
           for e in trainer.state.log_history if "loss" in e]
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump({"script": "hf_trainer_eval.py",
               "source": "huggingface/transformers docs/source/en/training.md (Fine-tuning guide, Trainer)",
               "framework": f"transformers {transformers.__version__}, PyTorch {torch.__version__.split('+')[0]}",
               "inject": None, "rtol": 5e-4, "printed": printed}, f, indent=1)
    f.write("\n")
