"""What each verb imports: users type `tfrun ps` all day, so a verb loads only what it needs (bench/cli_start.py
measures the time). Read from `python -X importtime`, which lists every module a run imported."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Tfrun, write_script

# Never in a local verb: the SSH stack (0.3-0.5 s to import), the daemon's own code and its dependencies, and
# the job side's frameworks.
NEVER_LOCAL = {"asyncssh", "cryptography", "tfrun.runner", "apprise", "sqlite3", "tensorflow", "numpy"}


def imported(tf: Tfrun, *argv: str, whole: bool = False) -> set[str]:
    """The top-level and `tfrun.*` modules a run of `tfrun ARGV` imported; with `whole`, every module's
    whole name too (`rich.console` as well as `rich`)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tfrun.client", *argv],
        env=tf.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    names = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.add(name if name.startswith("tfrun.") else name.split(".")[0])
            if whole:
                names.add(name)
            if name.startswith("tfrun.runner"):
                names.add("tfrun.runner")
    return names


@pytest.mark.parametrize("argv", [["--help"], ["ps"], ["ps", "-a", "--json"], ["status"], ["logs"], ["metrics"]])
def test_local_verbs_never_import_ssh_or_the_daemon(tf: Tfrun, project: Path, argv: list[str]) -> None:
    write_script(project, "job.py", "print('loss 0.5')\n")
    job = str(tf.submit(str(project / "job.py")))
    tf.ok("wait", job)
    full = [*argv, job] if argv in (["status"], ["logs"], ["metrics"]) else argv
    found = imported(tf, *full)
    assert "tfrun.client.cli.main" in found  # the run was read: the CLI itself is listed
    assert not found & NEVER_LOCAL, sorted(found & NEVER_LOCAL)


def test_help_draws_no_table(tf: Tfrun) -> None:
    """`tfrun --help` is click's text: rich, which tables and colour need, is not loaded for it."""
    assert "rich" not in imported(tf, "--help")


# What `tfrun --help` never loads: the verbs are listed from client/cli/verbs/'s VERBS, so neither the protocol, nor
# the event loop, nor rich, nor any verb's module is imported to print it.
NEVER_IN_HELP = {"asyncio", "tfrun.protocol", "rich", "tfrun.client.library.api", "tfrun.client.link.connection"}


def test_help_imports_no_verb(tf: Tfrun) -> None:
    found = imported(tf, "--help")
    assert "tfrun.client.cli.main" in found
    assert not found & NEVER_IN_HELP, sorted(found & NEVER_IN_HELP)
    assert not {name for name in found if name.startswith("tfrun.client.cli.verbs.")}


# What the views of `ps` and `status` never load: they write through client/views/styled.py, and rich's console (a
# quarter of their start) is left to `tfrun top`. rich.cells, which measures wide characters, is allowed.
RICH_CONSOLE = {"rich.console", "rich.text", "rich.live", "rich.table", "rich.markup"}


@pytest.mark.parametrize("argv", [["ps"], ["ps", "-a"], ["ps", "-a", "--json"], ["status"]])
def test_a_local_request_to_a_running_daemon_needs_no_event_loop(tf: Tfrun, project: Path, argv: list[str]) -> None:
    """ps and status ask a daemon that is up over a plain socket (client/link/syncchannel.py): no asyncio, no API;
    and they draw their table or their lines without rich's console."""
    write_script(project, "job.py", "print('done')\n")
    job = str(tf.submit(str(project / "job.py")))
    tf.ok("wait", job)
    found = imported(tf, *argv, *([job] if argv == ["status"] else []), whole=True)
    assert "tfrun.client.link.syncchannel" in found
    assert not found & {"asyncio", "tfrun.client.library.api", "tfrun.client.link.follow"}, sorted(found)
    assert not found & RICH_CONSOLE, sorted(found & RICH_CONSOLE)
    if argv in (["ps", "-a"], ["status"]):  # a row was drawn: through the light writer
        assert "tfrun.client.views.styled" in found


def test_a_small_submit_to_a_running_daemon_needs_no_event_loop(tf: Tfrun, project: Path) -> None:
    """A submit whose upload is small files goes over the plain socket (client/library/submission.py's send_here), so
    the job starts sooner (issue 28: Slurm submit until running); a bigger one, sent in chunks while their
    acknowledgements come back, takes the API's way. Both jobs run on exactly what was sent."""
    from tfrun.client.files.transfer import PLAIN_UPLOAD_BYTES

    write_script(
        project, "job.py", "import hashlib; print(hashlib.sha256(open('data.bin', 'rb').read()).hexdigest())\n"
    )
    tf.ok("ps")  # the daemon up
    for size, event_loop in ((100_000, False), (PLAIN_UPLOAD_BYTES + 1, True)):
        content = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        (project / "data.bin").write_bytes(content)
        found = imported(tf, "submit", str(project / "job.py"))
        assert ("asyncio" in found) is event_loop, size
        assert ("tfrun.client.library.api" in found) is event_loop, size
        job = str(max(row["id"] for row in tf.jobs()))
        tf.ok("wait", job)  # succeeded
        assert tf.ok("logs", job).strip() == hashlib.sha256(content).hexdigest()


def test_the_verb_table_says_what_each_verb_says() -> None:
    """`tfrun --help` lists each verb with the first sentence that VERBS holds for it, at any width as the
    verb's own help would be cut: the table and the verbs' docstrings never drift apart."""
    import click

    from tfrun.client.cli.main import main
    from tfrun.client.cli.verbs import VERBS

    assert sorted(main.commands) == sorted(VERBS)
    for name, (_, _, summary) in VERBS.items():
        command = main.commands[name]
        for limit in (30, 45, 80, 200, 10_000):
            assert click.Command(name, help=summary).get_short_help_str(limit) == command.get_short_help_str(limit)
