"""Stable-Baselines3's DQN example (DLR-RM/stable-baselines3, docs/modules/dqn.md, "Example", as of commit
e05d2dbe, 2026-06-15; run with stable-baselines3 2.9.2 from PyPI): DQN("MlpPolicy") on CartPole-v1 with
verbose=1, `model.learn(total_timesteps=10000, log_interval=4)`. SB3's logger prints a box every 4 episodes:

    ----------------------------------
    | rollout/            |          |
    |    ep_len_mean      | 18       |
    |    ep_rew_mean      | 18       |
    |    exploration_rate | 0.863    |
    | time/               |          |
    |    episodes         | 8        |
    |    fps              | 7712     |
    |    time_elapsed     | 0        |
    |    total_timesteps  | 144      |
    | train/              |          |
    |    learning_rate    | 0.0001   |
    |    loss             | 0.559    |
    |    n_updates        | 10       |
    ----------------------------------

after SB3's opening lines `Using cpu device`, "Wrapping the env with a `Monitor` wrapper" and `Wrapping the env
in a DummyVecEnv.`. The first box, at 59 timesteps, before learning starts at 100, has no train/ section; the log
has 249 boxes, 248 with train/loss (the agent does not learn CartPole here: the docs warn that this example's agent
may not solve it). In the NaN run (STEP 4000) the boxes from 4022 timesteps on print `loss | nan` (155 of them),
and the run goes on to 10000 timesteps.

Changes:
- `gym.make("CartPole-v1")` without the example's `render_mode="human"` (no display, no pygame here);
- `seed=0` given to DQN, and torch on 1 thread, so the run can be made again;
- only the training: the example's model.save / DQN.load and its endless rendering loop are left out;
- a callback passed to learn() for CORPUS_INJECT=nan:STEP: at the first environment step with
  num_timesteps >= STEP, the weight of the Q-network's last Linear (q_net.q_net[-1]) is filled with NaN, so every
  loss computed after it is NaN (SB3 does not raise on it: DQN's argmax over NaN Q-values still picks an action,
  and its epsilon-greedy exploration goes on);
- the truth sidecar (RUN.truth.json, RUN from CORPUS_RUN): Logger.dump is wrapped to note, for every box it
  prints, the `train/loss` value the logger holds (np.mean of that train() call's losses, full precision) and
  `time/total_timesteps`. Nothing that SB3 prints is changed.

SB3's HumanOutputFormat prints a float as f"{value:<8.3g}" (3 significant digits, rounded; "nan" for NaN), and
truncates keys and values longer than 36 characters (none here): the truth therefore has `rtol` 5e-3 (half a
unit of the 3rd significant digit, relative to the smallest 3-digit mantissa 1.00). `global` and `step` are the
box's time/total_timesteps; `epoch` is null (the box's time/episodes is an episode count, not an epoch).

    cd tests/data/real
    CORPUS_RUN=sb3_dqn PYTHONUNBUFFERED=1 /tmp/cv-rl/bin/python sb3_dqn.py > sb3_dqn.log 2>&1
    CORPUS_RUN=sb3_dqn.nan CORPUS_INJECT=nan:4000 PYTHONUNBUFFERED=1 /tmp/cv-rl/bin/python sb3_dqn.py \\
        > sb3_dqn.nan.log 2>&1

`inject.print` is the index in `printed` of the first box whose train/loss is NaN.
"""

import json
import math
import os

import gymnasium as gym
import stable_baselines3
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "sb3_dqn")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
printed = []

_dump = Logger.dump


def dump(self, step=0):
    """Logger.dump, noting the train/loss of every box it prints (full precision) before it prints it."""
    values = self.name_to_value
    if "train/loss" in values:
        t = int(values["time/total_timesteps"])
        printed.append({"epoch": None, "step": t, "global": t, "loss": float(values["train/loss"])})
    return _dump(self, step)


Logger.dump = dump


class InjectNaN(BaseCallback):
    """CORPUS_INJECT=nan:STEP: the Q-network's last weight set to NaN once num_timesteps reaches STEP."""

    done = False

    def _on_step(self) -> bool:
        if KIND == "nan" and not self.done and self.num_timesteps >= INJECT_STEP:
            with torch.no_grad():
                self.model.q_net.q_net[-1].weight.fill_(float("nan"))
            self.done = True
        return True


env = gym.make("CartPole-v1")

model = DQN("MlpPolicy", env, verbose=1, seed=0)
model.learn(total_timesteps=10000, log_interval=4, callback=InjectNaN())

first_nan = next((i for i, p in enumerate(printed) if not math.isfinite(p["loss"])), None)
truth = {
    "script": "sb3_dqn.py",
    "source": "DLR-RM/stable-baselines3 docs/modules/dqn.md (Example: DQN on CartPole-v1)",
    "framework": f"Stable-Baselines3 {stable_baselines3.__version__} / PyTorch {torch.__version__.split('+')[0]}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_nan} if INJECT else None,
    "rtol": 5e-3,
    "printed": printed,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
