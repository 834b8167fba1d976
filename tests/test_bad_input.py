"""Bad input gets one clear line and a documented exit code, never a traceback, and leaves no damage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from harness import Tfrun, local_and_ssh, write_script

from tfrun.shorten import shorten

pytestmark = [pytest.mark.slow]


def one_line_error(stderr: str, *expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfrun: error: "), stderr
    assert "Traceback" not in stderr
    for text in expected:
        assert text in stderr, stderr


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["submit", "/nonexistent/train.py"], 2, "/nonexistent/train.py: no such file"),
        (["submit", "--env", "NOEQUALS", "x.py"], 2, "NOEQUALS is not set here (--env NOEQUALS takes its value from"),
        (["submit", "--env", "=x", "x.py"], 2, "'=x' is not NAME=VALUE or NAME"),
        (["submit", "--name", "123", "x.py"], 2, "cannot be all digits"),
        (["submit", "--name", "a b", "x.py"], 2, "cannot contain spaces"),
        (["status", "999"], 3, "no job '999'"),
        (["status", "nosuchname"], 3, "no job 'nosuchname'"),
        (["logs", "999"], 3, "no job '999'"),
        (["logs", "-f", "999"], 3, "no job '999'"),
        (["wait", "999"], 3, "no job '999'"),
        # Each verb that takes a job says "no job" as an error, once (rm went on to count what it freed).
        (["rm", "999"], 3, "no job '999' on "),
        (["cancel", "999"], 3, "no job '999' on "),
        (["restart", "999"], 3, "no job '999' on "),
        (["checkpoints", "999"], 3, "no job '999' on "),
        (["pull", "999"], 3, "no job '999' on "),
        (["metrics", "999"], 3, "no job '999' on "),
        (["alerts", "999"], 3, "no job '999' on "),
        (["attach", "999"], 3, "no job '999' on "),
        (["stop", "999"], 3, "no job '999' on "),
        (["ps", "--host", "tf@"], 2, "cannot read 'tf@' as an ssh destination"),  # bad input, not 125
        (["cancel", "--grace", "-1", "1"], 2, "-1"),
        (["status", "1" + "0" * 30], 3, f"no job '1{'0' * 30}'"),  # beyond SQLite's integers
        (["wait", "1" + "0" * 30], 3, f"no job '1{'0' * 30}'"),
        (["status", "²"], 3, "no job '²'"),  # a digit to str.isdigit, not to int(): a name
        (["logs", "①"], 3, "no job '①'"),
        # The byte 0xff: no job name is ever that. Said in the words typed, not as the request's field.
        (["status", "job\udcff"], 2, "not a job id or name: 'job\\xff' (not UTF-8 text)"),
        (["logs", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["logs", "-f", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["cancel", "1", "\udcfe"], 2, "not a job id or name: '\\xfe' (not UTF-8 text)"),
        (["wait", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["rm", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["pull", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["restart", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["metrics", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["alerts", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["checkpoints", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["attach", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["stop", "\udcff"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["submit", "--after", "\udcff", "x.py"], 2, "not a job id or name: '\\xff' (not UTF-8 text)"),
        (["status", "x" * 129], 2, f"not a job id or name: '{'x' * 39}…' (longer than 128 characters)"),
        (["status", "1" * 129], 2, f"not a job id or name: '{'1' * 39}…' (longer than 128 characters)"),
        (["logs", "1", "--tail", "1" + "0" * 30], 3, "no job '1'"),  # any count, as GNU tail takes
        (["prune", "--keep-last", "1" + "0" * 30], 2, "is not in the range 0<=x<=9223372036854775807"),
        (["logs", "1", *["-e", "x"] * 1001], 2, "at most 1000 patterns of 65536 characters in all"),
        (["logs", "1", "-e", "x" * 65537], 2, "at most 1000 patterns of 65536 characters in all"),
        (["cancel", *["1"] * 1001], 2, "at most 1000 jobs at once"),
        (["frobnicate"], 2, "No such command 'frobnicate' (see tfrun --help)"),
        (["--frobnicate", "ps"], 2, "No such option '--frobnicate' (see tfrun --help)"),
        (["status", "--frobnicate", "1"], 2, "No such option '--frobnicate' (see tfrun status --help)"),
        (["wait"], 2, "Missing argument 'JOB' (see tfrun wait --help)"),
        (["alerts", "--last", "lots"], 2, "'lots' is not a valid integer range (see tfrun alerts --help)"),
        (["alerts", "--last", "0"], 2, "0 is not in the range 1<=x<=10000 (see tfrun alerts --help)"),
        (["hosts", "frob"], 2, "No such command 'frob' (see tfrun hosts --help)"),
        (["hosts", "add", "nobox"], 2, "no host 'nobox' yet: give its destination, tfrun hosts add nobox USER@HOST"),
        (["hosts", "add", "x", "tf@"], 2, "cannot read 'tf@' as an ssh destination (user@host:port)"),
    ],
)
@local_and_ssh
def test_bad_input_gets_a_clear_message_and_exit_code(tf: Tfrun, args: list[str], code: int, expected: str) -> None:
    result = tf.run(*args)
    assert result.returncode == code, result.stderr
    one_line_error(result.stderr, expected)


def test_a_host_whose_name_does_not_resolve_is_told_in_the_resolvers_words(tf: Tfrun) -> None:
    """A resolver's errno is not errno's: this said "Unknown error -2" where ssh says why."""
    result = tf.run("ps", "--host", "box.invalid")
    assert result.returncode == 125 and result.stderr.startswith("tfrun: error: cannot connect to box.invalid: ")
    assert "Unknown error" not in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_a_message_too_long_is_cut_at_a_word_with_an_ellipsis() -> None:
    """tfrun.shorten, for every message cut to a length (a config value, sbatch's answer, a delivery's error,
    an alert's log lines): words stay whole, the cut shows, the limit holds even for one long word."""
    why = "URL fetch failure on https://example.org/mnist.npz: None -- [Errno -2] Name or service not known"
    assert shorten(why, 200) == why
    assert shorten(why, 90) == "URL fetch failure on https://example.org/mnist.npz: None -- [Errno -2] Name or service…"
    assert shorten("abc def ghi", 8) == "abc def…" and shorten("abc def ghi", 9) == "abc def…"
    assert shorten("x" * 100, 40) == "x" * 39 + "…"
    assert all(len(shorten(why, limit)) <= limit for limit in range(2, 120))


def test_a_script_outside_its_workdir_or_a_workdir_that_is_a_file(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    write_script(project, "train.py", "pass\n")
    other = tmp_path / "other"
    other.mkdir()
    result = tf.run("submit", "--workdir", str(other), str(project / "train.py"))
    assert result.returncode == 2 and "is not inside the work dir" in result.stderr
    result = tf.run("submit", "--workdir", str(project / "train.py"), str(project / "train.py"))
    assert result.returncode == 2 and "not a directory" in result.stderr
    result = tf.run("submit", str(project))
    assert result.returncode == 2 and "not a file" in result.stderr


def test_a_script_that_cannot_be_executed_is_refused_before_anything_runs(tf: Tfrun, project: Path) -> None:
    write_script(project, "run.sh", "#!/bin/sh\necho hi\n")  # not executable
    result = tf.run("submit", str(project / "run.sh"))
    assert result.returncode == 2
    one_line_error(result.stderr, "is not executable", "chmod +x")
    assert tf.jobs() == []


def test_a_missing_interpreter_is_refused(tf: Tfrun, project: Path) -> None:
    write_script(project, "train.py", "pass\n")
    result = tf.run("submit", "--python", "/no/such/python", str(project / "train.py"))
    assert result.returncode == 2
    one_line_error(result.stderr, "job interpreter /no/such/python does not exist")
    result = tf.run("submit", "--python", "python-that-does-not-exist", str(project / "train.py"))
    assert result.returncode == 2 and "is not on the daemon's PATH" in result.stderr


def test_a_script_whose_interpreter_line_is_wrong_fails_as_a_job(tf: Tfrun, project: Path) -> None:
    write_script(project, "bad.sh", "#!/no/such/shell\n", executable=True)
    result = tf.run("submit", "-f", str(project / "bad.sh"))
    assert result.returncode == 127
    assert "tfrun: cannot start ./bad.sh" in result.stdout
    assert tf.job(1)["state"] == "failed"


def _without_dac_override() -> list[str]:
    """A prefix that makes root obey file permissions, so 'unreadable' means unreadable here too."""
    if os.getuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: root reads everything")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_an_unreadable_work_dir_is_refused(tmp_path: Path, project: Path) -> None:
    tf = Tfrun(tmp_path / "home", prefix=_without_dac_override())
    try:
        write_script(project, "train.py", "pass\n")
        project.chmod(0o300)  # listable by nobody, enterable by its owner
        result = tf.run("submit", "--workdir", str(project), str(project / "train.py"))
        assert result.returncode == 2, result.stderr
        one_line_error(result.stderr, "not readable")
    finally:
        project.chmod(0o755)
        tf.cleanup()


def test_an_unreadable_file_in_the_work_dir_fails_the_submit_and_leaves_no_job(tmp_path: Path, project: Path) -> None:
    tf = Tfrun(tmp_path / "home", prefix=_without_dac_override())
    try:
        write_script(project, "train.py", "pass\n")
        secret = write_script(project, "secret.bin", "s")
        secret.chmod(0)
        result = tf.run("submit", str(project / "train.py"))
        assert result.returncode == 2, result.stderr
        one_line_error(result.stderr, "cannot read", "secret.bin", "Permission denied")
        assert tf.jobs() == []
        assert list((tf.home / "jobs").iterdir()) == []
        secret.chmod(0o644)
        assert tf.submit(str(project / "train.py")) == 1
    finally:
        tf.cleanup()


def test_special_files_and_symlinks_in_the_work_dir(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    os.mkfifo(project / "a-fifo")  # reading it would block forever: it is skipped
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "x.txt").write_text("data\n")
    (project / "data").symlink_to(os.path.relpath(data, project))  # relative, pointing outside
    (project / "inner").symlink_to("train.py")  # relative, pointing inside
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref")
    write_script(
        project,
        "train.py",
        "import os\nprint(open('data/x.txt').read().strip(), os.readlink('inner'), "
        "os.path.exists('a-fifo'), os.path.exists('.git'))\n",
    )
    job_id = tf.submit(str(project / "train.py"))
    assert tf.run("wait", str(job_id)).returncode == 0, tf.log(job_id)
    assert tf.log(job_id) == b"data train.py False False\n"


def test_hostile_file_names_and_arguments(tf: Tfrun, tmp_path: Path) -> None:
    folder = tmp_path / "my project; rm -rf ~ $(x) 'quoted' ü"
    folder.mkdir()
    write_script(folder, "tr ain; echo pwned.py", "import sys\nprint(sys.argv[1:])\n")
    result = tf.run("submit", "-f", str(folder / "tr ain; echo pwned.py"), "$(id)", "; ls", "`x`", "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['$(id)', '; ls', '`x`', '\\n']\n"


def test_a_script_name_with_a_newline_is_refused_for_what_it_is(tf: Tfrun, project: Path) -> None:
    """Not "ignored by .gitignore or .tfrunignore" (there is none): the newline is why it cannot be sent."""
    write_script(project, "a\nb.py", "pass\n")
    result = tf.run("submit", str(project / "a\nb.py"))
    assert result.returncode == 2
    one_line_error(result.stderr, "'a\\nb.py': a name with a newline cannot be sent; rename it")
    assert "ignore" not in result.stderr and tf.jobs() == []
    write_script(project, "ok.py", "pass\n")
    result = tf.run("submit", str(project / "ok.py"))
    assert result.returncode == 0 and "tfrun: not sent (special files or unusable names): 'a\\nb.py'\n" in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--frobnicate"], "No such option '--frobnicate' (see tfrund --help)"),
        (
            ["stop", "--timeout", "soon"],
            "Invalid value for '--timeout': 'soon' is not a valid float (see tfrund stop --help)",
        ),
        (["frobnicate"], "No such command 'frobnicate' (see tfrund --help)"),
    ],
)
def test_tfrund_usage_errors_are_one_line_too(tf: Tfrun, args: list[str], expected: str) -> None:
    result = tf.daemon(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"tfrund: error: {expected}"], result.stderr


def test_submit_after_a_job_id_beyond_sqlites_integers_is_no_job(tf: Tfrun, project: Path) -> None:
    write_script(project, "train.py", "pass\n")
    result = tf.run("submit", "--after", "1" + "0" * 30, str(project / "train.py"))
    assert result.returncode == 3, result.stderr
    one_line_error(result.stderr, f"--after: no job '1{'0' * 30}'")
    assert tf.jobs() == []


@pytest.mark.parametrize(
    ("variable", "args"),
    [
        ("TFRUN_POOL_TIMEOUT", ["ps", "--host", "all"]),
        ("TFRUN_FLEET_TIMEOUT", ["ps", "--host", "all"]),  # its old name, still read
        ("TFRUN_RECONNECT_TIMEOUT", ["wait", "1"]),
    ],
)
def test_a_timeout_longer_than_a_year_is_refused_in_one_line(tf: Tfrun, variable: str, args: list[str]) -> None:
    """A timer of 10^23 days overflowed the OS's time_t deep in the keeper's start (a traceback, then a
    skipped box); every client duration is checked where it is read."""
    tf.env[variable] = "100000000000000000000000d"
    try:
        result = tf.run(*args)
    finally:
        del tf.env[variable]
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"tfrun: error: {variable} must be at most 365d, not '100000000000000000000000d'\n"


def test_a_pool_s_wait_is_read_under_its_old_names_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tfrun said "fleet" in two names before it said "pool" everywhere: `fleet_timeout` in the client's config
    and TFRUN_FLEET_TIMEOUT are still read; the new names win where both are given."""
    from tfrun.client.config import settings
    from tfrun.client.pools.members import member_wait

    config = tmp_path / "config.toml"
    monkeypatch.setenv("TFRUN_CONFIG", str(config))
    for name in ("TFRUN_POOL_TIMEOUT", "TFRUN_FLEET_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    config.write_text('fleet_timeout = "7s"\n')
    assert member_wait(settings.load()) == 7.0
    config.write_text('fleet_timeout = "7s"\npool_timeout = "3s"\n')
    assert member_wait(settings.load()) == 3.0
    monkeypatch.setenv("TFRUN_FLEET_TIMEOUT", "9s")
    assert member_wait(settings.load()) == 9.0
    monkeypatch.setenv("TFRUN_POOL_TIMEOUT", "2s")
    assert member_wait(settings.load()) == 2.0
