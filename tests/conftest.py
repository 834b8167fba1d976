"""The fixtures every test module may ask for: a tfrun of its own (`tf`, local or through the session's sshd),
a work dir, a gate, a tmux server, a mail server and an HTTP receiver. What they are made of is tests/harness/,
which bench/ imports too."""

from __future__ import annotations

import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Mailbox, Receiver, Sshd, Tfrun, remote_client

# A suite started in the background (`nohup pytest &`) has SIGINT ignored, and every command it starts would
# inherit that: `tfrun forward` and services, which tests stop with SIGINT as a person does with Ctrl-C, would
# never stop. A handler of pytest's own is reset to the default in each command it starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def tmux() -> Iterator[str]:
    """The name of a tmux server of the test's own (tmux -L NAME), and NAME-2 for a second one; killed after."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    server = f"tfrun-test-{uuid.uuid4().hex[:8]}"
    yield server
    for name in (server, f"{server}-2"):
        subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def tf(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tfrun]:
    """A tfrun client and daemon; parametrize with "ssh" (indirect) to reach the daemon through sshd."""
    instance = Tfrun(tmp_path / "home")
    if getattr(request, "param", "local") == "ssh":
        remote_client(instance, request.getfixturevalue("sshd"))
    yield instance
    instance.cleanup()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A work dir for jobs."""
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A file whose appearance releases jobs written with `gated_job`."""
    return tmp_path / "gate"


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox()
    box.start()
    yield box
    box.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.stop()
