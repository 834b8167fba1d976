"""A box shared by a team keeps its secrets (issue 27): notify URLs never reach a job's environment or its
spec.json, every URL shown is masked past its scheme and host, a host's --env never sits on a command line of
the box (another user, `mallory`, watches every process's /proc/PID/cmdline as `ps` would), `jupyter --open`
hands the browser a private page rather than the token, and a port another user bound first is refused with
the reason, before any request (token included) is sent to it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from harness import Receiver, Sshd, Tfrun, no_internet, remote_client, write_script
from harness.otheruser import CommandLineWatch, OtherUser, mallory  # noqa: F401

from tfrun.runner.alerts.outbox import masked

pytestmark = [pytest.mark.slow]

_PRINT_ENV = "import os\nfor key, value in sorted(os.environ.items()):\n    print(f'{key}={value}')\n"


def test_a_job_inherits_no_notify_url_and_its_spec_holds_none(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    daemon_secret, job_secret = f"daemon-{uuid.uuid4().hex}", f"job-{uuid.uuid4().hex}"
    tf.env["TFRUN_NOTIFY"] = f"json://127.0.0.1:{receiver.port}/{daemon_secret}"
    no_internet(tf.env)
    job = tf.submit(
        "--notify", f"json://127.0.0.1:{receiver.port}/{job_secret}", str(write_script(project, "env.py", _PRINT_ENV))
    )
    assert tf.run("wait", str(job)).returncode == 0
    printed = tf.log(job).decode()
    assert "TFRUN_JOB_ID=" in printed and "TFRUN_NOTIFY" not in printed
    spec = (tf.job_dir(job) / "spec.json").read_text()
    for secret in (daemon_secret, job_secret):
        assert secret not in printed and secret not in spec
    assert json.loads(tf.ok("config", "--json"))["sources"]["notify"] == "TFRUN_NOTIFY", "the daemon still has it"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("json://hooks.example.com/SECRETPATH", "json://hooks.example.com/***"),
        ("ntfy://SECRETTOPIC", "ntfy://***"),
        ("ntfy://ntfy.example.com/SECRETTOPIC", "ntfy://ntfy.example.com/***"),
        ("xml://hooks.example.com:8080/SECRETPATH?x=1", "xml://hooks.example.com:8080/***?***"),
        ("form://user:SECRETPW@hooks.example.com/SECRETPATH", "form://***@hooks.example.com/***"),
        ("mailto://user:SECRETPW@smtp.example.com?to=SECRETADDR@example.com", "mailto://***@smtp.example.com?***"),
        ("slack://SECRETA/SECRETB/SECRETC", "slack://***/***"),
    ],
)
def test_a_url_is_shown_masked_past_its_scheme_and_host(url: str, shown: str) -> None:
    assert masked(url) == shown and "SECRET" not in masked(url)


def test_config_and_notify_test_mask_urls_unless_the_user_asks(tf: Tfrun, receiver: Receiver) -> None:
    secret = uuid.uuid4().hex
    url = f"json://127.0.0.1:{receiver.port}/{secret}"
    tf.env["TFRUN_NOTIFY"] = url
    no_internet(tf.env)
    said = [tf.ok("config"), tf.ok("config", "--json"), tf.ok("notify-test"), tf.ok("alerts", "--verbose")]
    assert f"json://127.0.0.1:{receiver.port}/***" in said[0]
    assert json.loads(tf.ok("config", "--json", "--show-secrets"))["values"]["notify"] == [url]
    for text in [*said, (tf.home / "tfrund.log").read_text()]:
        assert secret not in text, text


@pytest.fixture
def slow_login(tmp_path: Path) -> Iterator[Sshd]:
    """A box whose login shell takes a while to start, as one with a conda hook in its startup file does (bash
    reads $BASH_ENV before it runs a command): sshd's command line stays on view meanwhile."""
    startup = write_script(tmp_path, "startup.sh", "sleep 0.5\n")
    server = Sshd(tmp_path / "slow-sshd", env={"BASH_ENV": str(startup)})
    yield server
    server.stop(sessions=True)


@pytest.mark.ssh
@pytest.mark.root
def test_a_hosts_env_is_on_no_command_line_of_the_box(tf: Tfrun, slow_login: Sshd, mallory: OtherUser) -> None:  # noqa: F811
    secret = f"s3cret-{uuid.uuid4().hex}"
    remote_client(tf, slow_login)
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.write_text(config.read_text().replace("env = { ", f'env = {{ TFRUN_PROBE = "{secret}", '))
    watch = CommandLineWatch(mallory, secret)
    direct = {**tf.env, "TFRUN_SSH_PERSIST": "0"}
    cache = tf.client_home / ".cache" / "tfrun" / "hosts.json"
    for _ in range(3):  # each without the socket learnt: through `tfrund dial-stdio`, which may start tfrund
        cache.unlink(missing_ok=True)
        result = subprocess.run([sys.executable, "-m", "tfrun.client", "ps"], env=direct, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr
    checked = tf.run("hosts", "check", "box").stdout  # `tfrund --version`, then dial-stdio (its doctor may fail)
    assert "ok  tfrund: " in checked and "ok  daemon: running" in checked, checked
    tf.ok("ps")  # through the keeper
    daemon_env = Path(f"/proc/{tf.daemon_pid()}/environ").read_bytes()
    assert f"TFRUN_PROBE={secret}".encode() in daemon_env, "the box's daemon got it, over stdin"
    control = watch.control()
    assert watch.seen() == [control], "the secret on no command line but the test's own"


def test_jupyter_open_gives_the_browser_no_token(tf: Tfrun, tmp_path: Path) -> None:
    tf.ok("config", "set", "job_python", sys.executable)
    record = tmp_path / "browser-argv"
    browser = write_script(tmp_path, "browser", f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n', executable=True)
    tf.env["BROWSER"] = str(browser)
    started = json.loads(tf.ok("jupyter", "--open", "--detach", "--json"))
    token = urlsplit(started["url"]).query.partition("token=")[2]
    argv = record.read_text()
    page = Path(urlsplit(argv.strip()).path)
    try:
        assert len(token) >= 32 and token not in argv
        assert stat.S_IMODE(page.stat().st_mode) == 0o600 and stat.S_IMODE(page.parent.stat().st_mode) == 0o700
        assert started["url"] in page.read_text(), "the page sends the browser on to the URL"
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert token.encode() not in line, line
    finally:
        tf.run("stop", started["name"])
        if page.name == "open.html":
            shutil.rmtree(page.parent, ignore_errors=True)


_SQUAT = r"""
import os, re, socket, time
end = time.monotonic() + 120
print("watching", flush=True)
while time.monotonic() < end:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        found = re.search(rb"\0--port=(\d+)\0--port-retries=0", line)
        if found:
            port = int(found[1])
            server = socket.socket()
            server.bind(("127.0.0.1", port))
            server.listen()
            server.settimeout(60)
            print("bound", port, flush=True)
            while True:  # until killed: each request that reaches it, printed
                client, _ = server.accept()
                client.settimeout(2)
                try:
                    print(repr(client.recv(65536)), flush=True)
                except OSError:
                    pass
"""


@pytest.mark.root
def test_a_port_another_user_took_first_is_refused_with_the_reason(tf: Tfrun, mallory: OtherUser) -> None:  # noqa: F811
    tf.ok("config", "set", "job_python", sys.executable)
    squatter = mallory.popen([sys.executable, "-c", _SQUAT], stdout=subprocess.PIPE)
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "watching"
    try:
        result = tf.run("jupyter", "--detach", "--json")
        bound = squatter.stdout.readline().split()
        assert bound[:1] == ["bound"], bound
        assert result.returncode != 0, "served by the squatter's listener"
        assert f"port {bound[1]} is taken by another process (uid {mallory.uid})" in result.stderr
        assert result.stderr.startswith("tfrun: error: ") and result.stderr.count("\n") == 1, result.stderr
    finally:
        squatter.kill()
        received, _ = squatter.communicate(timeout=30)
        for job in tf.jobs():
            if job.get("service") and job["state"] in ("queued", "running"):
                tf.run("stop", str(job["id"]))
    assert "token" not in received
