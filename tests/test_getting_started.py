"""docs/getting-started.md, run as a reader pastes it: every ```sh block of the page in its order, on this machine's
daemon and then on a box over a real sshd on 127.0.0.1, each block's output held to the ```text block after it.

The page is read each run, so a changed page changes what this test does. What a reader has and a test cannot
is stood in for, and only that:
- the checkout the page starts in is a copy of this one (its tracked and untracked files) in a temporary folder,
  and `python3` is this test's interpreter. Its `pip install` finds every package it names installed already (a
  PYTHONPATH of this venv's packages, tfrun's own left out) and builds tfrun from the tests' folder of wheels
  (PIP_NO_INDEX, PIP_FIND_LINKS): no network;
- the box (`alice@gpu-box` in the page) is an sshd on 127.0.0.1 whose sessions get a HOME of their own, a PATH
  whose `python3` is this test's interpreter (it has TensorFlow) and a pip that installs from that folder of
  wheels: `tfrun hosts install` runs as it does for a reader, from "the box's index";
- a notify URL is the tests' mail server's (mailto://, mailtos://) or HTTP receiver's (any other), and job ids
  are the ones the page's submits printed here;
- `tfrun ui` runs in the background until its page answers here, and is stopped as Ctrl-C does; `--open` opens
  a script that notes the address.

Each block runs in bash with the directory and environment the blocks before it left (a reader's shell), and must
exit 0. Its output (stdout and stderr, as a terminal shows them), with the stand-ins named as the page names them
(the box's address and user, its home, the machine's name in an alert), must hold each line of the ```text block
after it, in order, other lines allowed between them (TensorFlow's start-up messages, pip's own lines). Lines are
compared with what differs from run to run made alike: numbers, times, durations and sizes, paths, URLs, host key
fingerprints, braille dots (a plot's curve) and runs of blanks. `...` in a shown line stands for any text; a shown
line `...` alone says that lines were left out. A block with no ```text block after it must print nothing.

TFRUN_RECORD_GETTING_STARTED=FILE writes each block's command and output, stand-ins named as the page names them,
to FILE: the outputs to paste into the page after changing it.
"""

from __future__ import annotations

import contextlib
import getpass
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
from harness import Mailbox, Receiver, Sshd, Tfrun, free_port, wait_for
from harness.paths import REPO
from test_install import box_python, trust, wheelhouse

from tfrun.runner.alerts.outbox import masked

PAGE = REPO / "docs" / "getting-started.md"

pytestmark = [pytest.mark.tensorflow, pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(600)]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
URL = re.compile(r"'?\b([a-z][a-z0-9+.-]*)://[^\s']+'?")
DESTINATION = re.compile(r"(?<=\s)[\w.-]+@[\w.-]+(?::\d+)?(?=\s|$)")
JOB_VERBS = {"logs", "metrics", "status", "wait", "alerts", "cancel", "restart", "checkpoints", "pull", "attach"}


@dataclass
class Block:
    """A ```sh block of the page, the ```text block after it (None where none follows), and the file a ```python
    block before it says to save (its name and text), if any."""

    commands: str
    shown: Optional[str]
    line: int
    files: list[tuple[str, str]] = field(default_factory=list)


def page_blocks(text: str) -> list[Block]:
    """The page's ```sh blocks in order, each with its output and the files to save before it."""
    blocks: list[Block] = []
    files: list[tuple[str, str]] = []
    last_end = 0
    for match in FENCE.finditer(text):
        kind, body = match[1], match[2]
        before = text[last_end : match.start()]
        if kind == "python":
            named = re.findall(r"`([\w.-]+\.py)`", before)
            assert named, f"the ```python block at line {_line(text, match)} is not named: say `NAME.py` before it"
            files.append((named[-1], body))
        elif kind == "sh":
            blocks.append(Block(body, None, _line(text, match), files))
            files = []
        elif kind == "text" and blocks and not before.strip() and blocks[-1].shown is None:
            blocks[-1].shown = body
        last_end = match.end()
    assert not files, f"the page names files after its last ```sh block: {[name for name, _ in files]}"
    return blocks


def _line(text: str, match: re.Match[str]) -> int:
    return text.count("\n", 0, match.start()) + 1


# -- what differs from run to run, made alike --------------------------------------------------------------------

_NORMALIZE = [
    (re.compile(r"[\u2800-\u28ff]"), ""),  # braille dots: a plot's curve
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+"), "URL"),
    (re.compile(r"\bSHA256:[A-Za-z0-9+/]+"), "SHA256:KEY"),  # the box's host key
    (re.compile(r"(?<![\w.~/])~?(?:/[^\s:()'\",]+)+"), "PATH"),
    (re.compile(r"\b(job \d+ on )[\w.-]+"), r"\1HOST"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?"), "TIME"),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:B|kB|MB|GB|KiB|MiB|GiB)\b"), "SIZE"),
    (re.compile(r"\b(?:\d+(?:\.\d+)?(?:ms|us|µs|s|m|h|d))+\b"), "DUR"),
    (re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "N"),
    (re.compile(r"\s+"), " "),
]


def normalized(line: str) -> str:
    for pattern, replacement in _NORMALIZE:
        line = pattern.sub(replacement, line)
    return line.strip()


def _pattern(shown: str) -> re.Pattern[str]:
    """A shown line as a pattern over a normalized line: `...` stands for any text."""
    parts = [re.escape(part.strip()) for part in normalized(shown).split("...")]
    return re.compile(r"\s*.*?\s*".join(parts))


def missing_lines(shown: str, output: str) -> list[str]:
    """The shown lines (from the first one not found) that `output` does not hold in their order."""
    wanted = [line for line in shown.splitlines() if line.strip() and line.strip() != "..."]
    got = [normalized(line) for line in output.splitlines()]
    at = 0
    for index, line in enumerate(wanted):
        pattern = _pattern(line)
        found = next((i for i in range(at, len(got)) if pattern.fullmatch(got[i])), None)
        if found is None:
            return wanted[index:]
        at = found + 1
    return []


def test_the_normalizing_compares_what_matters() -> None:
    shown = "ID  NAME  STATE    RUNTIME\n1   -     running  2.1s\n...\nsent to mailtos://me:***@smtp.example.com/***\n"
    output = "ID NAME STATE RUNTIME\n12  -  running  1m3s\nnoise\nsent to mailto://127.0.0.1:2525/***\n"
    assert missing_lines(shown, output) == []
    assert missing_lines("1   -     failed  2.1s\n", output) == ["1   -     failed  2.1s"]
    assert missing_lines("b\na\n", "a\nb\n") == ["a"]  # in order
    installed = "installed tfrund 0.1.0 on box: {} (running, pid {})\n"
    assert missing_lines(installed.format("/home/alice/x/tfrund", 42), installed.format("/tmp/b/x/tfrund", 7)) == []
    assert missing_lines("Successfully installed ... tfrun-0.1.0 ...\n", "Successfully installed tfrun-0.1.0\n") == []
    assert missing_lines("job 2 on vm: loss is nan at step 4\n", "job 2 on ci-7: loss is nan at step 4\n") == []


def test_the_page_is_read_as_a_reader_reads_it() -> None:
    blocks = page_blocks(PAGE.read_text())
    commands = "\n".join(block.commands for block in blocks)
    verbs = ["pip install", "tfrun submit", "tfrun ps", "tfrun logs -f", "tfrun metrics", "tfrun hosts add",
             "tfrun hosts install", "tfrun hosts check", "--host box", "tfrun notify-test", "tfrun ui"]  # fmt: skip
    for verb in verbs:
        assert verb in commands, f"the tutorial no longer runs `{verb}`"
    assert [name for block in blocks for name, _ in block.files] == ["train.py"]
    assert all(block.shown is not None for block in blocks if re.search(r"(?m)^tfrun ", block.commands))


# -- the reader's machine and box -------------------------------------------------------------------------------


def _copy_checkout(to: Path) -> None:
    """This checkout's files as a reader's clone has them (tracked, and untracked ones not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def _installed_packages(folder: Path) -> Path:
    """A folder that shows this venv's packages, tfrun's own left out: a PYTHONPATH on which `pip install -e
    .[demo]` finds every dependency satisfied and installs tfrun alone."""
    folder.mkdir()
    # Every site-packages on the path, the first one's entry winning: a venv may see more than its own (a .pth
    # file that adds another's, --system-site-packages).
    for site in (Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()):
        for entry in site.iterdir():
            if "tfrun" not in entry.name.lower() and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


def _python3_only(folder: Path) -> Path:
    """A folder whose only entry is `python3`, running this test's interpreter."""
    folder.mkdir()
    (folder / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (folder / "python3").chmod(0o755)
    return folder


def _processes_with(variable: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if variable.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """A box that never had tfrun, whose python3 has TensorFlow and whose pip installs from the tests' wheels:
    (its sshd, its HOME). Its tfrund and jobs are stopped after."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    home = tmp_path / "box-home"
    home.mkdir()
    python = _python3_only(tmp_path / "box-bin")
    path = ":".join([str(python), "/usr/local/bin:/usr/bin:/bin"])
    probe = Sshd(tmp_path / "box-sshd", env={"HOME": str(home), "PATH": path})
    known = tmp_path / "probe_known_hosts"
    known.write_text(probe.known_hosts_line)
    wheels = wheelhouse(box_python(probe, known))
    probe.stop()
    env = {"HOME": str(home), "PATH": path, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    server = Sshd(tmp_path / "box-sshd", env=env)
    yield server, home
    state = home / ".local" / "state" / "tfrun"
    Tfrun(state, client_home=tmp_path / "box-stopper").cleanup()
    for pid in _processes_with(f"HOME={home}"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server.stop(sessions=True)


# -- running a block --------------------------------------------------------------------------------------------


@dataclass
class Shell:
    """A reader's shell between blocks: its directory and environment."""

    cwd: Path
    env: dict[str, str]
    state: Path

    def run(self, commands: str, timeout: float = 300) -> tuple[int, str]:
        """Run `commands` in bash as a pasted block, in this shell's directory and environment, and keep both as
        the block leaves them; (its exit status, its output)."""
        self.state.mkdir(exist_ok=True)
        script = f"set -eo pipefail\n{commands}\npwd > {self.state}/cwd\nenv -0 > {self.state}/env\n"
        result = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
        if result.returncode == 0:
            self.cwd = Path((self.state / "cwd").read_text().strip())
            pairs = (item.split("=", 1) for item in (self.state / "env").read_text().split("\0") if "=" in item)
            self.env = dict(pairs)
        return result.returncode, result.stdout


@dataclass
class UiRun:
    proc: subprocess.Popen[str]
    lines: list[str]

    def url(self) -> Optional[str]:
        return next((line.strip() for line in self.lines if line.startswith("http://127.0.0.1:")), None)

    def printed_or_ended(self) -> bool:
        return self.url() is not None or self.proc.poll() is not None


def start_ui(shell: Shell, commands: str) -> UiRun:
    """A block that runs `tfrun ui`, in the background, in its own process group (as a terminal's foreground job)."""
    proc = subprocess.Popen(["bash", "-c", commands], cwd=shell.cwd, env=shell.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    run = UiRun(proc, [])
    assert proc.stdout is not None
    out = proc.stdout

    def read() -> None:
        for line in out:
            run.lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return run


def stop_ui(run: UiRun) -> str:
    """Ctrl-C: SIGINT to its process group; what it printed."""
    try:
        os.killpg(run.proc.pid, signal.SIGINT)
        run.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
    except ProcessLookupError:
        pass
    time.sleep(0.2)  # the reader thread's last lines
    return "".join(run.lines)


def _get(port: int, path: str, cookie: Optional[str] = None, first_event: bool = False) -> tuple[int, str]:
    """GET `path` from the UI; with `first_event`, only up to the end of the stream's first event."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Cookie": cookie} if cookie else {}
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    if not first_event:
        body = response.read().decode()
    else:
        lines: list[str] = []
        while True:
            line = response.readline().decode()
            if not line or (line == "\n" and any(seen.startswith("data:") for seen in lines)):
                break
            lines.append(line)
        body = "".join(lines)
    cookies = response.getheader("Set-Cookie") or ""
    connection.close()
    return response.status, body + ("\nSet-Cookie: " + cookies if cookies else "")


def check_ui_answers(url: str) -> None:
    """The page `tfrun ui` printed answers, with its key, and its jobs table lists jobs of this machine and of the
    box."""
    port = int(re.match(r"http://127\.0\.0\.1:(\d+)/", url)[1])  # type: ignore[index]
    status, body = _get(port, "/" + url.split("/", 3)[3])  # the key, exchanged for a cookie
    cookie = re.search(r"Set-Cookie: ([^;]+)", body)
    assert status in (200, 303) and cookie, (status, body[-500:])
    status, body = _get(port, "/", cookie[1])
    assert status == 200 and "tfrun" in body, (status, body[:500])
    status, view = _get(port, "/api/view", cookie[1])
    assert status == 200 and json.loads(view)["boxes"] == ["local", "box"], view
    status, events = _get(port, "/events/jobs", cookie[1], first_event=True)
    data = re.search(r"(?m)^data: (.*)$", events)
    assert status == 200 and data, events
    jobs = json.loads(data[1])
    assert jobs["boxes"] == {"local": {"up": True, "why": None}, "box": {"up": True, "why": None}}, jobs
    assert {row["box"] for row in jobs["rows"] if row["state"] == "succeeded"} == {"local", "box"}, jobs


# -- the test ---------------------------------------------------------------------------------------------------


def test_the_getting_started_page_works_as_written(
    tf: Tfrun, box: tuple[Sshd, Path], mailbox: Mailbox, receiver: Receiver, tmp_path: Path
) -> None:
    text = PAGE.read_text()
    blocks = page_blocks(text)
    server, box_home = box
    destination = trust(tf, server)
    checkout = tmp_path / "tfrun"
    page_destination = _page_destination(text)
    user, host = page_destination.split("@")[0], page_destination.split("@")[1].split(":")[0]
    # What this test's run prints, named as the page names it: longest first, so that a path's folders go whole.
    stand_ins = [
        (str(checkout), f"/home/{user}/tfrun"),
        (str(box_home), f"/home/{user}"),
        (str(tf.client_home), f"/home/{user}"),
        (str(tmp_path / "box-bin"), "/usr/bin"),
        (destination, page_destination),
        (f" as {getpass.getuser()},", f" as {user},"),
        (f" on {socket.gethostname()}:", f" on {host}:"),
        *((masked(ours), masked(theirs)) for ours, theirs in _page_urls(text, mailbox, receiver)),
    ]
    record = os.environ.get("TFRUN_RECORD_GETTING_STARTED")
    if record:
        Path(record).write_text("")

    _copy_checkout(checkout)
    opened = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(opened))}\n')
    browser.chmod(0o755)
    env = dict(tf.env)
    env.update(
        PATH=f"{_python3_only(tmp_path / 'bin')}:{env['PATH']}",
        PYTHONPATH=str(_installed_packages(tmp_path / "packages")),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheelhouse(f"{sys.version_info[0]}.{sys.version_info[1]}")),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        BROWSER=str(browser),
    )
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "TFRUN_WHEELHOUSE"):
        env.pop(name, None)
    shell = Shell(checkout, env, tmp_path / "shell-state")

    ids: dict[str, str] = {}  # a job id the page shows -> the one printed here
    ran: list[str] = []
    ui_checked = False
    for block in blocks:
        for name, text in block.files:
            (shell.cwd / name).write_text(text)
        commands = _made_concrete(block.commands, destination, mailbox, receiver, ids)
        where = f"docs/getting-started.md:{block.line}: $ {commands.strip()}"
        if re.search(r"(?m)^\s*tfrun ui\b", commands):
            run = start_ui(shell, commands)
            try:
                wait_for(run.printed_or_ended, timeout=60, what="tfrun ui to print its URL")
                assert run.proc.poll() is None, f"{where}\n{''.join(run.lines)}"
                url = run.url()
                assert url is not None
                check_ui_answers(url)
                if "--open" in commands:
                    wait_for(opened.exists, timeout=30, what="tfrun ui --open to open the page")
            finally:
                output = stop_ui(run)
            status = 0
            ui_checked = True
        else:
            status, output = shell.run(commands)
            deadline = time.monotonic() + 30
            while (status == 0 and block.shown is not None and re.fullmatch(r"(tfrun alerts\b[^\n]*\n)+", commands)
                   and missing_lines(block.shown, output) and time.monotonic() < deadline):  # fmt: skip
                time.sleep(1)  # alerts are delivered in the background: a reader looks a moment later
                status, output = shell.run(commands)
        for ours, theirs in stand_ins:
            output = output.replace(ours, theirs)
        if record:
            with open(record, "a") as out:
                out.write(f"$ {block.commands.strip()}\n{output}\n")
        assert status == 0, f"{where}\nexited {status}:\n{output}"
        if block.shown is None:
            assert output == "", f"{where}\nprints what the page does not show:\n{output}"
        else:
            missing = missing_lines(block.shown, output)
            assert not missing, f"{where}\nthe page shows {missing[0]!r}, not printed here:\n{output}"
            _note_job_ids(block, output, ids)
        ran.append(commands)

    # What the blocks did, seen from outside them.
    assert ui_checked, "the page never runs `tfrun ui`"
    box_jobs = box_home / ".local" / "state" / "tfrun" / "jobs"
    assert box_jobs.is_dir() and any(box_jobs.iterdir()), "no job ran on the box"
    assert (tf.home / "jobs").is_dir() and any((tf.home / "jobs").iterdir()), "no job ran on this machine"
    sent = [subject for subject, _ in mailbox.texts()] + [str(post.get("title")) for post in receiver.posts]
    assert any("test message" in subject for subject in sent), sent
    assert any(subject.startswith("[tfrun spike]") for subject in sent), sent


def _page_destination(text: str) -> str:
    """The box's address as the page's `tfrun hosts add` names it."""
    for block in page_blocks(text):
        for line in block.commands.splitlines():
            if line.split()[:3] == ["tfrun", "hosts", "add"] and (found := DESTINATION.search(line)):
                return found[0]
    raise AssertionError("the page adds no host with an address (tfrun hosts add NAME USER@HOST)")


def _page_urls(text: str, mailbox: Mailbox, receiver: Receiver) -> list[tuple[str, str]]:
    """(this test's URL, the page's) for each notify URL of the page's commands."""
    return [(_receiver_url(found[1], mailbox, receiver), found[0].strip("'"))
            for block in page_blocks(text) for found in URL.finditer(block.commands)]  # fmt: skip


def _receiver_url(scheme: str, mailbox: Mailbox, receiver: Receiver) -> str:
    return mailbox.url if scheme in ("mailto", "mailtos") else receiver.url


def _made_concrete(commands: str, destination: str, mailbox: Mailbox, receiver: Receiver, ids: dict[str, str]) -> str:
    """The block with what stands for the reader's made this test's: the box's address, notify URLs, job ids,
    a fixed port of `tfrun ui`."""
    lines = []
    for line in commands.splitlines():
        if not line.lstrip().startswith("tfrun "):
            lines.append(line)
            continue

        def url(match: re.Match[str]) -> str:
            return shlex.quote(_receiver_url(match[1], mailbox, receiver))

        line = URL.sub(url, line)
        words = line.split()
        if words[1:3] == ["hosts", "add"]:
            line = DESTINATION.sub(destination, line)
        if words[1] in JOB_VERBS and ids:
            line = re.sub(r"(?<=\s)(\d+)(?=\s|$)", lambda m: ids.get(m[1], m[1]), line, count=1)
        if words[1] == "ui":
            line = re.sub(r"--port \d+", f"--port {free_port()}", line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _note_job_ids(block: Block, output: str, ids: dict[str, str]) -> None:
    """After a submit: the id the page shows it print, and the one it printed here."""
    if not re.search(r"(?m)^\s*tfrun submit\b", block.commands):
        return
    assert block.shown is not None
    pattern = re.compile(r"(?m)^(?:job )?(\d+)(?: submitted.*)?$")
    shown, got = pattern.search(block.shown), pattern.search(output)
    if shown:
        assert got, f"the page's submit prints a job id, this one did not:\n{output}"
        ids[shown[1]] = got[1]
