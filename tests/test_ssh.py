"""The transport to a box: host keys checked like OpenSSH, socket forwarding or its fallback, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import (
    TFRUN,
    Sshd,
    Tfrun,
    alive,
    gated_job,
    keepers_of,
    remote_client,
    wait_for,
    write_script,
)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def box(tf: Tfrun, sshd: Sshd) -> Tfrun:
    return remote_client(tf, sshd)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.ssh
def test_an_unknown_host_key_is_refused_until_accepted(tf: Tfrun, sshd: Sshd, project: Path) -> None:
    remote_client(tf, sshd, trust=False)
    write_script(project, "ok.py", "print('ok')\n")
    result = tf.run("submit", str(project / "ok.py"))
    assert result.returncode == 125
    line = one_line(result.stderr)
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", f"{sshd.host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert "is unknown" in line and fingerprint in line and "--accept-new-host-key" in line
    assert not tf.home.exists(), "nothing may reach a box whose key is not trusted"

    result = tf.run("submit", "--accept-new-host-key", "-f", str(project / "ok.py"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert sshd.known_hosts_line.split()[2] in (tf.client_home / ".ssh" / "known_hosts").read_text()
    assert tf.run("ps", "-a").returncode == 0, "accepted once, trusted from then on"


@pytest.mark.ssh
def test_a_changed_host_key_is_always_refused_and_nothing_is_sent(tf: Tfrun, sshd: Sshd, project: Path) -> None:
    remote_client(tf, sshd)
    other = tf.client_home / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tf.client_home / ".ssh" / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {Path(f'{other}.pub').read_text().strip()}\n")
    write_script(project, "ok.py", "print('ok')\n")
    for extra in ([], ["--accept-new-host-key"]):
        result = tf.run("submit", *extra, str(project / "ok.py"))
        assert result.returncode == 125
        line = one_line(result.stderr)
        assert "has CHANGED" in line and "ssh-keygen -R" in line
    assert not tf.home.exists(), "no daemon was started, no file was sent"


@pytest.mark.ssh
@pytest.mark.tensorflow
def test_without_socket_forwarding_the_exec_fallback_serves_every_verb(
    tf: Tfrun, tmp_path: Path, project: Path, gate: Path
) -> None:
    server = Sshd(tmp_path / "sshd-restricted", forwarding=False)
    try:
        remote_client(tf, server)
        write_script(project, "job.py", gated_job(2, 1, 9, gate))
        for _ in range(2):  # the second time the socket path is known: forwarding is tried, refused, remembered
            job_id = tf.submit(str(project / "job.py"))
            assert tf.job(job_id)["state"] == "running"
        gate.touch()
        result = tf.run("logs", "-f", "1")
        assert result.returncode == 9 and result.stdout.count("before") == 2
        assert tf.run("wait", "2").returncode == 9
        cache = json.loads((tf.client_home / ".cache" / "tfrun" / "hosts.json").read_text())
        assert [entry.get("forwarding_refused") for entry in cache.values()] == [True]
        _set_host(tf, python=sys.executable)  # hosts check imports TensorFlow in the job python
        check = tf.run("hosts", "check", timeout=300)
        assert check.returncode == 0 and "socket forwarding refused" in check.stdout, check.stdout
    finally:
        server.stop()


@pytest.mark.ssh
@pytest.mark.tensorflow
def test_forwarding_is_used_once_the_socket_is_known(box: Tfrun, project: Path) -> None:
    write_script(project, "ok.py", "print('ok')\n")
    box.ok("wait", str(box.submit(str(project / "ok.py"))))
    cache = json.loads((box.client_home / ".cache" / "tfrun" / "hosts.json").read_text())
    assert [entry["socket"] for entry in cache.values()] == [str(box.home / "run" / "tfrund.sock")]
    _set_host(box, python=sys.executable)  # hosts check imports TensorFlow in the job python
    check = box.run("hosts", "check", timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "socket forwarding to" in check.stdout and "tfrund, version" in check.stdout


@pytest.mark.ssh
def test_losing_the_ssh_connection_mid_follow_leaves_the_job_running(box: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "job.py", gated_job(50, 20, 4, gate))
    job_id = box.submit(str(project / "job.py"))
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=box.env, stdout=-1, stderr=-1)
    wait_for(lambda: b"before 49" in box.log(job_id), what="output")
    os.kill(follower.pid, signal.SIGKILL)  # the client and its SSH connection go at once
    follower.wait()
    assert box.job(job_id)["state"] == "running"
    gate.touch()
    result = box.run("logs", "-f", str(job_id))
    assert result.returncode == 4
    assert result.stdout.count("before") == 50 and result.stdout.count("after") == 20


@pytest.mark.ssh
def test_a_follower_whose_connection_is_cut_by_the_server_resumes_without_gap(
    box: Tfrun, sshd: Sshd, project: Path, gate: Path
) -> None:
    write_script(project, "job.py", gated_job(300, 300, 0, gate))
    job_id = box.submit(str(project / "job.py"))
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=box.env, stdout=-1, stderr=-1)
    wait_for(lambda: b"before 299" in box.log(job_id), what="output")
    sessions = sorted(sshd.sessions())
    assert sessions, "the follower holds an SSH session"
    for pid in sessions:
        os.kill(pid, signal.SIGKILL)
    gate.touch()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert out == (box.job_dir(job_id) / "output.log").read_bytes()


def _set_host(tf: Tfrun, **changes: str) -> None:
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    text = config.read_text()
    for key, value in changes.items():
        lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
        lines.insert(1, f"{key} = {json.dumps(value)}")
        text = "\n".join(lines) + "\n"
    config.write_text(text)


@pytest.mark.ssh
def test_a_box_without_tfrund_gets_the_install_hint(box: Tfrun) -> None:
    _set_host(box, tfrund="/nonexistent/bin/tfrund")
    result = box.run("ps")
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert "tfrund was not found on box" in line and "tfrun hosts install box" in line and "--tfrund" in line


@pytest.mark.ssh
def test_a_box_whose_tfrund_went_away_under_a_kept_connection_says_so(box: Tfrun, tmp_path: Path) -> None:
    """tfrun uninstalled on the box while a keeper holds its connection, the daemon stopped: the keeper's channel
    ends before the hello, and the verb, rather than "closed the connection before answering the hello",
    connects by itself and says what the box's shell said."""
    wrapper = tmp_path / "tfrund"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m tfrun.runner "$@"\n')
    wrapper.chmod(0o755)
    _set_host(box, tfrund=str(wrapper))
    box.ok("ps")
    assert len(keepers_of(box)) == 1
    assert box.daemon("stop").returncode == 0
    wrapper.unlink()
    result = box.run("ps")
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert "tfrund was not found on box" in line and "tfrun hosts install box" in line, line


@pytest.mark.ssh
def test_connection_refused_and_auth_failures_are_one_line(box: Tfrun, sshd: Sshd, tmp_path: Path) -> None:
    _set_host(box, destination=f"root@127.0.0.1:{_closed_port()}")
    result = box.run("ps")
    assert result.returncode == 125 and "cannot connect to root@127.0.0.1" in one_line(result.stderr)

    _set_host(box, destination=f"root@127.0.0.1:{sshd.port}")
    wrong = box.client_home / ".ssh" / "id_ed25519"
    wrong.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], input=b"y\n", check=True)
    result = box.run("ps")
    assert result.returncode == 125 and "authentication" in one_line(result.stderr)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_hosts_add_list_remove(tf: Tfrun) -> None:
    assert tf.run("hosts", "list").stdout.startswith("no hosts configured")
    added = tf.run("hosts", "add", "gpu", "alice@gpu-box:2222", "--env", "TFRUN_HOME=/data/t", "--tfrund", "/opt/t")
    assert added.returncode == 0 and "default host" in added.stdout
    tf.ok("hosts", "add", "cpu", "cpu-box")
    listing = json.loads(tf.ok("hosts", "list", "--json"))
    assert listing["default_host"] == "gpu"
    assert listing["hosts"]["gpu"] == {
        "destination": "alice@gpu-box:2222",
        "tfrund": "/opt/t",
        "env": {"TFRUN_HOME": "/data/t"},
    }
    assert "* gpu  alice@gpu-box:2222" in tf.ok("hosts", "list")
    tf.ok("hosts", "remove", "gpu")
    assert json.loads(tf.ok("hosts", "list", "--json"))["default_host"] is None
    assert tf.run("hosts", "remove", "gpu").returncode == 2
    assert tf.run("hosts", "add", "local", "x").returncode == 2
    # `--host local` reaches the daemon on this machine whatever the default.
    tf.ok("hosts", "add", "cpu", "cpu-box", "--default")
    assert tf.run("ps", "--host", "local").returncode == 0


@pytest.mark.ssh
def test_one_kept_connection_serves_every_command_and_can_be_turned_off(box: Tfrun, project: Path) -> None:
    write_script(project, "ok.py", "print('ok')\n")
    for _ in range(3):
        assert box.run("submit", "-f", str(project / "ok.py")).stdout == "ok\n"
    keepers = keepers_of(box)
    assert len(keepers) == 1, "racing or repeated commands share one keeper per box"
    os.kill(keepers[0], signal.SIGKILL)
    wait_for(lambda: not alive(keepers[0]), what="the keeper to die")
    direct = {**box.env, "TFRUN_SSH_PERSIST": "0"}
    result = subprocess.run(
        [*TFRUN, "submit", "-f", str(project / "ok.py")], env=direct, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert keepers_of(box) == [], "TFRUN_SSH_PERSIST=0 connects directly"
    assert len(json.loads(box.ok("ps", "-a", "--json"))) == 4
    assert len(keepers_of(box)) == 1, "a dead keeper is replaced by the next command"


@pytest.mark.ssh
def test_a_kept_connection_serves_only_callers_who_trust_the_box_alike(tmp_path: Path, sshd: Sshd) -> None:
    """The keeper is shared by a user's commands, never by callers whose ~/.ssh would not let them in."""
    trusting = remote_client(Tfrun(tmp_path / "home", client_home=tmp_path / "alice"), sshd)
    stranger = remote_client(Tfrun(tmp_path / "home", client_home=tmp_path / "bob"), sshd, trust=False)
    try:
        trusting.ok("ps")
        assert len(keepers_of(trusting)) == 1
        result = stranger.run("ps")
        assert result.returncode == 125 and "is unknown" in one_line(result.stderr), result.stderr

        (trusting.client_home / ".ssh" / "known_hosts").write_text("")  # as `ssh-keygen -R` would leave it
        result = trusting.run("ps")
        assert result.returncode == 125 and "is unknown" in one_line(result.stderr), result.stderr
    finally:
        trusting.cleanup()


@pytest.mark.ssh
def test_a_jump_host_leads_to_the_box_with_the_named_key(box: Tfrun) -> None:
    """`hosts add --jump`: through the box's own sshd to itself (ProxyJump 127.0.0.1 -> 127.0.0.1), logging in
    on both with a key that only --identity-file names."""
    key = box.client_home / "keys" / "box_ed25519"
    key.parent.mkdir()
    shutil.move(str(box.client_home / ".ssh" / "id_ed25519"), key)
    host = json.loads(box.ok("hosts", "list", "--json"))["hosts"]["box"]
    common = ["hosts", "add", "box", host["destination"], "--tfrund", host["tfrund"], "--env", f"TFRUN_HOME={box.home}"]
    box.ok(*common, "--jump", host["destination"])
    result = box.run("ps")
    assert result.returncode == 125 and "authentication to jump host" in one_line(result.stderr), result.stderr

    box.ok(*common, "--jump", host["destination"], "--identity-file", str(key))
    assert json.loads(box.ok("hosts", "list", "--json"))["hosts"]["box"]["jump"] == host["destination"]
    result = box.run("ps", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stderr

    closed = f"root@127.0.0.1:{_closed_port()}"  # the way is taken: a dead hop on it is the error
    box.ok(*common, "--jump", f"{host['destination']},{closed}", "--identity-file", str(key))
    result = box.run("ps")
    assert result.returncode == 125 and f"jump host {closed}" in one_line(result.stderr), result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--identity-file", "~/.ssh/nokey"], "identity file ~/.ssh/nokey does not exist"),
        (["--jump", "me@"], "cannot read 'me@' as a jump host"),
        (["--jump", "a,,b"], "cannot read '' as a jump host"),
    ],
    ids=["no-identity-file", "bad-jump", "empty-hop"],
)
def test_hosts_add_refuses_what_could_not_connect(tf: Tfrun, args: list[str], expected: str) -> None:
    result = tf.run("hosts", "add", "box", "gpu-host", *args)
    assert result.returncode == 2 and expected in one_line(result.stderr)
    assert tf.run("hosts", "list", "--json").stdout.count("gpu-host") == 0
