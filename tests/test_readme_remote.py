"""README.md's "Remote boxes" block, run as written, in its order, against a real sshd on 127.0.0.1.

The commands are read out of README.md each run, so a changed README changes what this test does. Only three
things are made concrete: the destination (`alice@gpu-box:2222` becomes this sshd's user@127.0.0.1:port), the
TFRUN_HOME value (this test's own), and the job id `pull` names (the one `submit` printed). The script the
README submits is written under the README's own name into the project folder the commands run in: a small
TensorFlow training script that trains a Keras model on the CPU, saves its weights into its checkpoint folder
and writes results/ in its work dir, for the two `pull` lines to bring back.

The box never had tfrun: its sessions get a HOME of their own and a PATH (sshd's SetEnv) that starts with a
folder whose only entry is `python3`, running this test's venv Python (which has TensorFlow). The venv's own
bin/ cannot be on that PATH: it has a tfrund. So the box's default job interpreter, python3 on tfrund's PATH,
imports TensorFlow, and `hosts check` passes without the README's commands naming one. `hosts install` works
offline, from the folder of wheels tests/test_install.py keeps in the tests' cache (TFRUN_WHEELHOUSE).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TFRUN, Sshd, Tfrun, write_script
from harness.paths import REPO
from test_install import box_python, start_bare_box, trust, wheelhouse

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib

SECTION = "## Remote boxes"
DESTINATION = re.compile(r"[\w.-]+@[\w.-]+(:\d+)?")

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow, pytest.mark.timeout(600)]

TRAIN = """\
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

print("tensorflow", tf.__version__, "imported", flush=True)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, y, epochs=2, batch_size=32, verbose=2)
loss = history.history["loss"][-1]
print(f"final loss={loss:.4f}", flush=True)
model.save_weights(os.path.join(os.environ["TFRUN_CHECKPOINT_DIR"], "model.weights.h5"))
os.makedirs("results", exist_ok=True)
with open("results/metrics.json", "w") as out:
    json.dump({"loss": loss}, out)
"""


def readme_block() -> list[list[str]]:
    """The commands of the first ```sh block under README's "Remote boxes" heading, comments dropped."""
    text = (REPO / "README.md").read_text()
    assert SECTION in text, f"README.md lost its {SECTION!r} section"
    section = text.split(SECTION, 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, f"README.md's {SECTION!r} section has no ```sh block"
    joined = re.sub(r"\\\n\s*", " ", match[1])
    commands = [shlex.split(line, comments=True) for line in joined.splitlines()]
    return [words for words in commands if words]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """A box that never had tfrun, whose python3 has TensorFlow: (its sshd, its HOME)."""
    python_only = tmp_path / "box-bin"
    python_only.mkdir()
    (python_only / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (python_only / "python3").chmod(0o755)
    server, home = start_bare_box(tmp_path, python_only)
    yield server, home
    server.stop()


def test_the_readme_remote_boxes_block_works_as_written(tf: Tfrun, box: tuple[Sshd, Path], project: Path) -> None:
    server, box_home = box
    commands = readme_block()
    assert all(words[0] == "tfrun" for words in commands), commands
    destination = trust(tf, server)
    tf.env["TFRUN_WHEELHOUSE"] = str(wheelhouse(box_python(server, tf.client_home / ".ssh" / "known_hosts")))
    scripts = [word for words in commands if words[1] == "submit" for word in words if word.endswith(".py")]
    assert len(scripts) == 1, f"the README's block should submit one .py script: {commands}"
    (project / scripts[0]).parent.mkdir(parents=True, exist_ok=True)
    (project / scripts[0]).write_text(TRAIN)

    job = None
    ran: list[str] = []
    for words in commands:
        args = []
        for word in words[1:]:
            if DESTINATION.fullmatch(word):
                word = destination
            elif word.startswith("TFRUN_HOME="):
                word = f"TFRUN_HOME={tf.home}"
            args.append(word)
        verb = " ".join(args[:2]) if args[0] == "hosts" else args[0]
        if verb == "pull":
            assert job is not None, "the README pulls before it submits"
            assert args[1].isdigit(), f"`tfrun pull` should name a job id first: {words}"
            args[1] = job
        result = subprocess.run([*TFRUN, *args], cwd=project, env=tf.env, capture_output=True, text=True, timeout=300)
        shown = f"tfrun {shlex.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
        assert result.returncode == 0, shown
        ran.append(verb)

        if verb == "hosts install":
            venv = box_home / ".local" / "share" / "tfrun" / "venv"
            assert result.stdout.splitlines()[-1].startswith("installed tfrund ") and str(venv) in result.stdout, shown
        elif verb == "ssh-config":
            assert re.search(r"(?m)^Host box$", (tf.client_home / ".ssh" / "config").read_text()), shown
            config = tomllib.loads((tf.client_home / ".config" / "tfrun" / "config.toml").read_text())
            assert config["hosts"]["box"]["destination"] == "box", config
        elif verb == "hosts check":
            lines = [line for line in result.stdout.splitlines() if line.strip()]
            assert lines and all(line.startswith(("ok ", "warn ")) for line in lines), shown
            assert any(line.startswith("ok  tensorflow: ") for line in lines), shown
        elif verb == "submit":
            found = re.search(r"(?m)^job (\d+) submitted", result.stderr)
            assert found, shown
            job = found[1]
            assert re.search(r"(?m)^tensorflow \S+ imported$", result.stdout), shown
            assert re.search(r"(?m)^Epoch 2/2$", result.stdout) and "loss: " in result.stdout, shown
            assert re.search(r"(?m)^final loss=\d+\.\d{4}$", result.stdout), shown
        elif verb == "pull" and len(args) == 2:
            assert (project / "checkpoints" / "model.weights.h5").stat().st_size > 0, shown
        elif verb == "pull":
            assert "loss" in (project / "results" / "metrics.json").read_text(), shown
            assert "final loss=" in (project / "output.log").read_text(), shown
    for verb in ("hosts add", "hosts install", "ssh-config", "hosts check", "submit", "pull"):
        assert verb in ran, f"the README's block no longer runs `tfrun {verb}`: {commands}"
    assert ran.count("pull") == 2, commands


def test_hosts_checks_advice_followed_word_for_word_keeps_the_host(tf: Tfrun, tmp_path: Path, project: Path) -> None:
    """A new user's first hour (issue 44): the box's python3 has no TensorFlow, `hosts check` says which of its
    interpreters has and how to choose it; done as it says, the host keeps its tfrund and its env (they were
    dropped: the next verbs talked to a daemon of another home), `hosts check` passes, and a job runs there."""
    server, box_home = start_bare_box(tmp_path)
    try:
        trained = box_home / "venvs" / "train" / "bin"
        trained.mkdir(parents=True)
        (trained / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        (trained / "python").chmod(0o755)
        destination = trust(tf, server)
        tfrund = shlex.join([sys.executable, "-m", "tfrun.runner"])
        tf.ok("hosts", "add", "box", destination, "--tfrund", tfrund, "--env", f"TFRUN_HOME={tf.home}")
        config = tf.client_home / ".config" / "tfrun" / "config.toml"
        before = tomllib.loads(config.read_text())["hosts"]["box"]

        check = tf.run("hosts", "check", "box")
        assert check.returncode == 1, check.stdout + check.stderr
        advice = re.search(r"`(tfrun hosts add [^`]+)`", check.stdout)
        assert advice and str(trained / "python") in check.stdout, check.stdout
        words = [{"NAME": "box", "PATH": str(trained / "python")}.get(word, word) for word in shlex.split(advice[1])]
        tf.ok(*words[1:])
        after = tomllib.loads(config.read_text())["hosts"]["box"]
        assert after == {**before, "python": str(trained / "python")}, (before, after)
        check = tf.run("hosts", "check", "box")
        assert check.returncode == 0 and "ok  tensorflow: " in check.stdout, check.stdout + check.stderr
        write_script(project, "hi.py", "import tensorflow, sys\nprint('tf in', sys.executable)\n")
        assert "\ntf in " in "\n" + tf.ok("submit", "-f", str(project / "hi.py"))  # after TensorFlow's own lines
    finally:
        server.stop(sessions=True)
