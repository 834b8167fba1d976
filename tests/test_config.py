"""The daemon's config as a verb: `tfrun config` shows it (secrets masked), `config set` edits config.toml in
place and reloads it, `config reload` and SIGHUP read it again, all without a restart, locally and over SSH;
unknown keys in either config file are named with their line and the nearest known key; and a config that
stops tfrund from starting reaches the client as one line, whatever carries it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from harness import Receiver, Tfrun, gated_job, local_and_ssh, no_internet, wait_for, write_script

from tfrun import tomltext
from tfrun.paths import Layout
from tfrun.runner.config import settings as daemon_config

SECRET = "hunter2-secret"


def secret_url(receiver: Receiver) -> str:
    """The receiver's URL with a password in it (the receiver takes any): what must never be shown."""
    return f"json://alice:{SECRET}@127.0.0.1:{receiver.port}/alerts"


def write_config(tf: Tfrun, text: str) -> Path:
    tf.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = tf.home / "config.toml"
    path.write_text(text)
    no_internet(tf.env)
    return path


def shown(tf: Tfrun) -> dict[str, Any]:
    return json.loads(tf.ok("config", "--json"))  # type: ignore[no-any-return]


def one_line_error(result: Any, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tfrun: error: "), result.stderr
    return str(result.stderr)


@local_and_ssh
def test_config_shows_what_the_daemon_uses_with_urls_masked(tf: Tfrun, receiver: Receiver) -> None:
    write_config(tf, f'# my box\nnotify = ["{secret_url(receiver)}"]\nmax_cpu_jobs = 2\n\n[alerts]\ncooldown = "5m"\n')
    record = shown(tf)
    assert record["path"] == str(tf.home / "config.toml")
    assert record["values"]["notify"] == [f"json://***@127.0.0.1:{receiver.port}/***"]
    assert record["values"]["max_cpu_jobs"] == 2 and record["values"]["alerts"]["cooldown"] == "5m"
    assert record["values"]["alerts"]["expire"] == "1d" and record["sources"]["alerts.expire"] == "default"
    assert record["sources"]["notify"] == "config.toml"
    assert record["values"]["checkpoint_root"] == str(tf.home / "checkpoints")
    text = tf.ok("config")
    assert SECRET not in text and f'notify = ["json://***@127.0.0.1:{receiver.port}/***"]' in text
    assert "\n[alerts]\n" in text and 'cooldown = "5m"\nexpire = "1d"  # default\n' in text
    assert SECRET not in (tf.home / "tfrund.log").read_text()


@local_and_ssh
def test_config_set_notify_reaches_the_receiver_without_a_restart(
    tf: Tfrun, project: Path, gate: Path, receiver: Receiver
) -> None:
    hand = '# written by hand\nmax_cpu_jobs = 3   # the box has 4 cores\n\n[alerts]\n# quiet nights\ncooldown = "1h"\n'
    path = write_config(tf, hand)
    job = tf.submit(str(write_script(project, "job.py", gated_job(1, 1, 3, gate))))
    tf.shim_pid(job)  # running: its alert watch has begun, with the daemon's notify as it was (none)
    pid = tf.daemon_pid()

    result = tf.run("config", "set", "notify", secret_url(receiver))
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "notify: applies now" in result.stdout
    assert path.read_text() == (
        "# written by hand\nmax_cpu_jobs = 3   # the box has 4 cores\n"
        f'notify = ["{secret_url(receiver)}"]\n\n[alerts]\n# quiet nights\ncooldown = "1h"\n'
    )
    sent = tf.run("notify-test")
    assert sent.returncode == 0 and SECRET not in sent.stdout, sent.stderr
    wait_for(lambda: receiver.posts, what="the test message")
    gate.touch()  # the job that was running before the set fails: its alert goes to the new URL too
    wait_for(lambda: any("failed" in post.get("title", "") for post in receiver.posts), what="the failed alert")
    assert tf.daemon_pid() == pid, "no restart"

    # A second set edits its own line only; a value the daemon would refuse changes nothing.
    tf.ok("config", "set", "alerts.cooldown", "30m")
    assert path.read_text().endswith('[alerts]\n# quiet nights\ncooldown = "30m"\n')
    before = path.read_text()
    assert "max_cpu_jobs must be a whole number" in one_line_error(tf.run("config", "set", "max_cpu_jobs", "lots"), 2)
    assert "cooldown must be a duration" in one_line_error(tf.run("config", "set", "alerts.cooldown", "soon"), 2)
    assert "did you mean 'notify'?" in one_line_error(tf.run("config", "set", "notfy", "x"), 2)
    refused = one_line_error(tf.run("config", "set", "notify", "mailto://smtp.example.com"), 2)
    assert "mailto:// needs a sender: add from=ADDRESS" in refused  # what is wrong, as notify-test says it
    assert path.read_text() == before
    assert shown(tf)["values"]["alerts"]["cooldown"] == "30m"
    assert "max_cpu_jobs" in tf.ok("config", "unset", "max_cpu_jobs")
    assert "max_cpu_jobs" not in path.read_text() and shown(tf)["values"]["max_cpu_jobs"] == 0
    assert tf.ok("config", "unset", "max_cpu_jobs").endswith(": nothing changed\n")
    assert tf.daemon_pid() == pid


def test_config_set_takes_values_that_begin_with_a_dash(tf: Tfrun) -> None:
    """sbatch options are written as they are typed, with no `--` before them; tfrun's own options still count."""
    out = json.loads(tf.ok("config", "set", "slurm.sbatch_options", "--qos=high", "--constraint=a100", "--json"))
    assert out["values"]["slurm"]["sbatch_options"] == ["--qos=high", "--constraint=a100"]
    assert 'sbatch_options = ["--qos=high", "--constraint=a100"]' in (tf.home / "config.toml").read_text()
    refused = tf.run("config", "set", "slurm.sbatch_options", "--output=x.out")
    assert "tfrun writes the output" in one_line_error(refused, 2)


def test_sighup_and_config_reload_read_the_file_again(tf: Tfrun, receiver: Receiver) -> None:
    path = write_config(tf, "max_cpu_jobs = 1\n")
    tf.ok("ps")
    pid = tf.daemon_pid()
    path.write_text(f'notify = ["{secret_url(receiver)}"]\nmax_cpu_jobs = 1\n')
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: shown(tf)["values"]["notify"], what="the reload")
    assert tf.run("notify-test").returncode == 0
    wait_for(lambda: receiver.posts, what="the test message")

    path.write_text("max_cpu_jobs = 1\ncheckpoint_roots = '/tmp'\n")  # refused: the running config stays
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: "config not reloaded (SIGHUP)" in (tf.home / "tfrund.log").read_text(), what="the refusal")
    err = one_line_error(tf.run("config", "reload"), 2)
    assert f"{path} line 2: unknown key 'checkpoint_roots'; did you mean 'checkpoint_root'?" in err
    assert shown(tf)["values"]["notify"], "the running config stays"
    path.write_text("max_cpu_jobs = 4\n")
    out = tf.ok("config", "reload")
    assert "notify: applies now" in out and "max_cpu_jobs: applies now" in out
    assert shown(tf)["values"]["notify"] == [] and tf.daemon_pid() == pid


def test_a_nul_byte_in_a_config_string_is_refused_with_its_line(tf: Tfrun) -> None:
    """No path, argument or URL can hold one: the daemon's and the client's files alike say where it is."""
    daemon_file = write_config(tf, 'max_cpu_jobs = 1\n\n[slurm]\nsbatch_options = ["--qos=a\\u0000"]\n')
    err = one_line_error(tf.run("ps"), 125)
    assert f"{daemon_file} line 4: slurm.sbatch_options cannot hold a NUL byte" in err
    daemon_file.write_text('job_python = "/usr/bin/python3\\u0000"\n')
    assert "line 1: job_python cannot hold a NUL byte" in one_line_error(tf.run("ps"), 125)
    daemon_file.unlink()
    client_file = tf.client_home / ".config" / "tfrun" / "config.toml"
    client_file.parent.mkdir(parents=True, exist_ok=True)
    client_file.write_text('[hosts.box]\ndestination = "me@box"\npython = "/bin/py\\u0000"\n')
    assert f"{client_file} line 3: hosts.box.python cannot hold a NUL byte" in one_line_error(tf.run("ps"), 2)


def test_unknown_keys_name_their_file_line_and_the_nearest_key(tf: Tfrun) -> None:
    daemon_file = write_config(tf, 'max_cpu_jobs = 1\n\ncheckpoint_roots = "/data"\n')
    err = one_line_error(tf.run("ps"), 125)
    assert f"{daemon_file} line 3: unknown key 'checkpoint_roots'; did you mean 'checkpoint_root'?" in err
    daemon_file.write_text('[alerts]\nrules = ["oom"]\ncooldwn = "5m"\n')
    err = one_line_error(tf.run("ps"), 125)
    assert "line 3: unknown key 'cooldwn' in [alerts]; did you mean 'cooldown'?" in err
    daemon_file.write_text('cooldown = "5m"\n')
    assert "line 1: unknown key 'cooldown'; it belongs in [alerts]" in one_line_error(tf.run("ps"), 125)
    daemon_file.unlink()

    client_file = tf.client_home / ".config" / "tfrun" / "config.toml"
    client_file.parent.mkdir(parents=True, exist_ok=True)
    client_file.write_text('default_host = "local"\n\n[hosts.box]\ndestination = "me@box"\npyhton = "/bin/py"\n')
    err = one_line_error(tf.run("ps"), 2)
    assert f"{client_file} line 5: unknown key 'pyhton' in [hosts.box]; did you mean 'python'?" in err
    client_file.write_text('reconect_timeout = "1m"\n')
    err = one_line_error(tf.run("ps"), 2)
    assert "line 1: unknown key 'reconect_timeout'; did you mean 'reconnect_timeout'?" in err
    client_file.write_text('[hosts]\nbox = { destination = "me@box", tfrund = "tfrund" }\nlab = { destinaton = "x" }\n')
    assert "line 3: unknown key 'destinaton' in [hosts.lab]; did you mean 'destination'?" in one_line_error(
        tf.run("ps"), 2
    )
    client_file.write_text('[hosts.box]\ndestination = "me@box"\nenv = { ANY_NAME = "x" }\n')
    assert tf.run("ps").returncode == 0, "a host's env takes any names"


BROKEN = 'max_cpu_jobs = 2\nnotify = ["json://127.0.0.1:1/alerts"\n'  # the array is never closed


@pytest.mark.parametrize(
    ("tf", "transport"),
    [
        ("local", "local"),
        pytest.param("ssh", "keeper", marks=pytest.mark.ssh),
        pytest.param("ssh", "direct", marks=pytest.mark.ssh),
    ],
    indirect=["tf"],
)
def test_a_config_that_stops_tfrund_reaches_the_client_in_one_line(tf: Tfrun, transport: str) -> None:
    if transport == "direct":
        tf.env["TFRUN_SSH_PERSIST"] = "0"
    path = write_config(tf, BROKEN)
    where = "" if transport == "local" else " on box"
    expected = f"tfrun: error: tfrund cannot start{where}: {path} line 2: Unclosed array\n"
    assert one_line_error(tf.run("ps"), 125) == expected
    # A daemon that ran, then stopped with the file broken since: the next start says why, even through a
    # connection keeper that is already up (it passes on what the box said).
    path.write_text("max_cpu_jobs = 2\n")
    tf.ok("ps")
    tf.daemon("stop")
    path.write_text(BROKEN)
    assert one_line_error(tf.run("ps"), 125) == expected


# -- config.toml as text ------------------------------------------------------------------------------------


def test_the_documented_example_is_a_valid_config_that_names_every_key(tmp_path: Path) -> None:
    """runner/config/settings.py's docstring is the reference: it loads, and it shows every key KEYS knows."""
    example = daemon_config.__doc__ or ""
    example = example[example.index("checkpoint_root =") :]
    daemon_config.Config.parse(example, Layout(tmp_path))
    for name in daemon_config.KEYS:
        assert tomltext.line_of(example, tuple(name.split("."))), f"{name} is not in the example"


TEXT = """\
# top comment
notify = [
    "json://a",  # first
]
max_cpu_jobs = 1  # cap

[alerts]
rules = ["oom"]   # only this
cooldown = "5m"

[other]
x = "a # not a comment"  # a comment
"""


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("max_cpu_jobs",), "2", TEXT.replace("max_cpu_jobs = 1  # cap", "max_cpu_jobs = 2  # cap")),
        (("notify",), '["json://b"]', TEXT.replace('notify = [\n    "json://a",  # first\n]', 'notify = ["json://b"]')),
        (("alerts", "cooldown"), '"1h"', TEXT.replace('cooldown = "5m"', 'cooldown = "1h"')),
        (("alerts", "expire"), '"2d"', TEXT.replace('cooldown = "5m"\n', 'cooldown = "5m"\nexpire = "2d"\n')),
        (("job_python",), '"/p"', TEXT.replace("# cap\n", '# cap\njob_python = "/p"\n')),
        (("other", "x"), '"b"', TEXT.replace('x = "a # not a comment"', 'x = "b"')),
        (("new", "y"), "1", TEXT + "\n[new]\ny = 1\n"),
    ],
)
def test_set_key_edits_only_its_own_lines(path: tuple[str, ...], value: str, expected: str) -> None:
    edited = tomltext.set_key(TEXT, path, value)
    assert edited == expected
    assert tomltext.line_of(edited, path)


def test_set_key_in_files_without_the_key_or_the_table() -> None:
    assert tomltext.set_key("", ("a",), "1") == "a = 1\n"
    assert tomltext.set_key("# only a comment", ("a",), "1") == "# only a comment\na = 1\n"
    assert tomltext.set_key("[alerts]\nrules = []\n", ("a",), "1") == "a = 1\n\n[alerts]\nrules = []\n"
    assert tomltext.set_key("a = 1\n", ("alerts", "rules"), "[]") == "a = 1\n\n[alerts]\nrules = []\n"
    assert tomltext.remove_key(TEXT, ("max_cpu_jobs",)) == TEXT.replace("max_cpu_jobs = 1  # cap\n", "")
    assert tomltext.remove_key(TEXT, ("alerts", "expire")) is None
