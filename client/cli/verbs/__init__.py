"""The verbs of `tfrun`, one module per group, and their table: `tfrun --help` lists them from it, and a
verb's module is imported only when that verb runs or shows its help (client/cli/main.py holds what they share).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, MutableMapping
from typing import Any

import click

from tfrun.constants import COMPLETE_VAR
from tfrun.usage import OneLineUsageGroup

# Each verb: its module here, its function there, and the first sentence of its help, which
# `tfrun --help` lists without importing the module (tests/test_imports.py checks it against the verb's).
# fmt: off
VERBS: dict[str, tuple[str, str, str]] = {
    "submit": ("submit", "submit", "Run SCRIPT [ARGS]... as a detached job, from a snapshot of its work dir."),
    "ps": ("jobs", "ps", "List jobs that have not ended (with -a, every job)."),
    "status": ("jobs", "status", "Show one job: state, exit code, times, folders."),
    "wait": ("jobs", "wait", "Wait until JOB ends, then exit with its exit code (128+N for signal N, 255 if lost)."),
    "cancel": ("jobs", "cancel", "Stop jobs: SIGTERM to each job's process group, SIGKILL to whatever is left "
               "after --grace."),
    "restart": ("jobs", "restart", "Run an ended JOB again, as a new job: the same snapshot (not your files as they "
                "are now), command, environment, and the same checkpoint folder, so a job using tfrun.jobs resumes "
                "where it stopped."),
    "logs": ("logs", "logs", "Print JOB's output (stdout and stderr, as the job wrote them); without JOB, the newest "
             "job's (which one is said on stderr)."),
    "attach": ("logs", "attach", "Open JOB's terminal: a job submitted with --tty runs in a tmux session on the box; "
               "this attaches to it, to answer input() or drive a breakpoint()."),
    "top": ("watching", "top", "A live view of the box: its unfinished and last ended jobs with their state, GPUs, "
            "runtime, last loss and its trend, and its GPUs with their memory, load and job."),
    "alerts": ("watching", "alerts", "What fired, when, and whether it was delivered: the alerts of JOB, or of every "
               "job and the box."),
    "notify-test": ("watching", "notify_test", "Send a test message from the box to URL (any apprise URL), or to each "
                    "notify URL of the daemon's config; say for each whether it was sent or why not."),
    "metrics": ("watching", "metrics", "JOB's metrics by step: exact per-step values when the script uses tfrun.jobs "
                "(its callback or Progress), else what the daemon read from its output: Keras and tqdm/Lightning "
                "progress bars, prints such as `step 100 loss=1.23`, `iter 5: loss 2.1`, dicts and JSON lines, "
                "boosting rounds (`[10] training's l1: 0.34`), column tables, boxes of `| name | value |` rows, and "
                "--metric patterns."),
    "gpus": ("watching", "gpus", "The box's GPUs: memory in use, utilisation, and the job each is given to (`submit "
             "--gpus N` gives a job N GPUs of its own), or who holds it outside your daemon (another user's job, a "
             "process outside tfrun), which keeps your jobs off it."),
    "doctor": ("admin", "doctor", "Check the box for training, as its daemon sees it: the job interpreter and its "
               "TensorFlow (built with CUDA, GPUs seen, memory growth), the NVIDIA driver and CUDA version from "
               "nvidia-smi, the checkpoint root (writable, free space), and the box's object storage ([storage] "
               "checkpoints_to) where it names one."),
    "checkpoints": ("files", "checkpoints", "List JOB's checkpoints: each one's step, when it was saved, its size, "
                    "and whether it is in its folder on the box."),
    "pull": ("files", "pull", "Copy a job's checkpoints or files back to this machine (from object storage when the "
             "box cannot be reached and the job stored its checkpoints there: JOB may also be the stored folder's "
             "URL)."),
    "config": ("admin", "config_verb", "The box's daemon config (config.toml in tfrund's TFRUN_HOME): show it, "
               "change it, reload it."),
    "hosts": ("hosts", "hosts", "The boxes tfrun knows (kept in ~/.config/tfrun/config.toml, or TFRUN_CONFIG)."),
    "pools": ("pools", "pools", "List each pool with its members: whether each answers, its free and total GPUs, its "
              "running and queued jobs."),
    "ssh-config": ("hosts", "ssh_config", "Print the OpenSSH Host block that names a box NAME; with --write, add it "
                   "to ~/.ssh/config."),
    "completion": ("hosts", "completion_script", "Print the Tab-completion script for bash, zsh or fish."),
    "rm": ("housekeeping", "rm", "Remove ended jobs from the box: each one's folder (work dir snapshot, log, "
           "metrics) and its records (events, alerts)."),
    "prune": ("housekeeping", "prune", "Remove ended jobs in bulk, as `tfrun rm` does, and collect the uploaded "
              "contents no job needs."),
    "forward": ("services", "forward", "Forward LOCAL_PORT on this machine to BOX_PORT on the box, through tfrun's SSH "
                "connection to it, until Ctrl-C."),
    "tensorboard": ("services", "tensorboard", "Show jobs in TensorBoard: the box runs it (as a service its daemon "
                    "supervises) over each JOB's TensorBoard folder, one run per job named ID-name, and this forwards "
                    "a local port to it until Ctrl-C, which stops it."),
    "jupyter": ("services", "jupyter", "Open JupyterLab on the box: the box's daemon runs it (as a service it "
                "supervises, with the job interpreter, the same environment jobs get and --gpus GPUs of its own) "
                "with a fresh token, and this forwards a local port to it and prints the URL with the token, until "
                "Ctrl-C, which stops it."),
    "services": ("services", "services", "List the services on the box (TensorBoard, Jupyter) that have not ended: "
                 "name, job id, state, the box port each listens on, its GPUs and how long it has run."),
    "stop": ("services", "stop", "Stop a service: NAME as `tfrun services` shows it (tensorboard, jupyter-2) or its "
             "job id."),
    "ui": ("ui", "ui", "See training in a web browser: every box's jobs, each job's log followed live and its "
           "metrics by step, jobs compared, the GPUs and the alerts."),
    "df": ("housekeeping", "df", "What tfrun's folders take on the box: job folders, their logs, uploaded contents "
           "(blobs), spare snapshots, checkpoints, the database; sizes on disk, as `du` counts them."),
}
# fmt: on


class LazyVerbs(MutableMapping[str, click.Command]):
    """The top group's verbs by name (click's `commands`): a verb's module is imported the first time its
    command is looked up, to run it or show its help; listing the names imports nothing."""

    def __init__(self, verbs: dict[str, tuple[str, str, str]]) -> None:
        self.verbs = verbs
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            module, function, _ = self.verbs[name]  # KeyError for a verb that does not exist, as a dict's
            command: click.Command = getattr(importlib.import_module(f"tfrun.client.cli.verbs.{module}"), function)
            self.loaded[name] = command
        return self.loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        raise TypeError("the verbs are those of VERBS")

    def __delitem__(self, name: str) -> None:
        raise TypeError("the verbs are those of VERBS")

    def __iter__(self) -> Iterator[str]:
        return iter(self.verbs)

    def __len__(self) -> int:
        return len(self.verbs)


class VerbGroup(OneLineUsageGroup):
    """The top group: its verbs come from `VERBS`, each module imported only when that verb is used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyVerbs(VERBS)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if os.environ.get(COMPLETE_VAR, "").startswith("bash"):  # a Tab press: bash's words need our reading
            from .. import completion

            completion.register()
        return super().main(*args, **kwargs)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """`tfrun --help`'s list of verbs, each with its first sentence as click would cut it, from `VERBS`."""
        limit = formatter.width - 6 - max(map(len, VERBS))
        rows = [(name, click.Command(name, help=VERBS[name][2]).get_short_help_str(limit)) for name in sorted(VERBS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
