"""Output that scripts and pipes can use, and a command line that says where it acts: `ps`'s header and
every "no job" error name the box, rows are never wrapped, colour follows --color, NO_COLOR and
FORCE_COLOR, and the small verbs scripts want (`ps -q`, `logs -n`, `cancel --all`, completion)."""

from __future__ import annotations

import dataclasses
import getpass
import json
import shlex
import sqlite3
import subprocess
import time
from pathlib import Path

import click
import pytest
from harness import TFRUN, Tfrun, gated_job, local_and_ssh, wait_for, write_script

from tfrun.client.calls import jobs as job_calls
from tfrun.protocol.jobs import Job, JobList

pytestmark = [pytest.mark.slow]

ARGV = "import sys\nprint(sys.argv[1:])\n"
LONG_ARGS = ["--comment", "x" * 150, "--tag", "the-very-end"]


def where(tf: Tfrun) -> str:
    """How tfrun names the place `tf` talks to."""
    return "box" if tf.remote else "this machine"


@local_and_ssh
def test_ps_and_every_no_such_job_error_name_the_host(tf: Tfrun, project: Path) -> None:
    place = f"box ({getpass.getuser()}@127.0.0.1:" if tf.remote else "this machine"
    assert tf.ok("ps").startswith(f"no jobs on {place}")
    job = tf.submit(str(write_script(project, "argv.py", ARGV)))
    tf.ok("wait", str(job))
    lines = tf.ok("ps", "-a").splitlines()
    assert lines[0].startswith(f"jobs on {place}") and (tf.remote or lines[0] == "jobs on this machine"), lines
    assert lines[1].split()[:3] == ["ID", "NAME", "STATE"] and lines[2].split()[0] == str(job)
    for args in (["status", "9999"], ["logs", "9999"], ["logs", "-f", "9999"], ["wait", "9999"], ["cancel", "9999"]):
        result = tf.run(*args)
        assert result.returncode == 3 and result.stderr.strip().endswith(f"no job '9999' on {where(tf)}"), (
            args,
            result.stderr,
        )
    assert tf.ok("ps", "--json").strip() == "[]"  # scripts get no header


def test_tfrun_options_after_the_script_are_passed_on_with_a_warning(tf: Tfrun, project: Path) -> None:
    script = str(write_script(project, "argv.py", ARGV))
    result = tf.run("submit", script, "--host", "box", "--gpus=2", "--epochs", "3")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"tfrun: warning: --host, --gpus after SCRIPT go to {script}, not to tfrun; put tfrun's options "
        "before SCRIPT, or write -- before the script's own to pass them on without this warning"
    ], result.stderr
    job = int(result.stdout)
    tf.ok("wait", str(job))
    assert tf.log(job) == b"['--host', 'box', '--gpus=2', '--epochs', '3']\n"
    deliberate = tf.run("submit", script, "--", "--host", "box", "--", "x")
    assert deliberate.returncode == 0 and "warning" not in deliberate.stderr, deliberate.stderr
    tf.ok("wait", deliberate.stdout.strip())
    assert tf.log(deliberate.stdout.strip()) == b"['--host', 'box', '--', 'x']\n"  # only the first -- is tfrun's
    plain = tf.run("submit", script, "--epochs", "3")
    assert plain.returncode == 0 and "warning" not in plain.stderr


def test_pipes_get_whole_rows_with_no_escape_codes_and_no_trailing_spaces(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "slow.py", gated_job(1, 0, 0, gate))
    jobs = [tf.submit("--name", f"run-{i}", str(project / "slow.py"), *LONG_ARGS) for i in range(3)]
    tf.env["COLUMNS"] = "40"  # a pipe has no width: rows stay whole whatever COLUMNS says
    try:
        table = tf.ok("ps", "-a")
        rows = table.splitlines()
        assert len(rows) == 2 + len(jobs) and "\x1b" not in table, table
        for job, row in zip(jobs, rows[2:]):
            assert row.split()[0] == str(job) and row.endswith("--tag the-very-end"), row
        assert all(line == line.rstrip() for line in rows), table
        grep = subprocess.run(f"{' '.join(TFRUN)} ps -a | grep run-1", shell=True, env=tf.env, capture_output=True,
                              text=True)  # fmt: skip
        assert grep.stdout.count("\n") == 1 and "the-very-end" in grep.stdout
        detail = tf.ok("status", str(jobs[0]))
        assert "\x1b" not in detail and all(line == line.rstrip() for line in detail.splitlines()), detail
        assert any(line.split() == ["state", "running"] for line in detail.splitlines()), detail
    finally:
        gate.touch()
        tf.ok("cancel", "--all")


LONG_NAME = "long-" + "n" * 100
LONG_METRIC = "a_metric_whose_name_goes_on_" + "m" * 80
LONG_FILE = "weights-" + "w" * 100 + ".h5"
LONG_JOB = f"""\
import os, sys
for step in (1, 2):
    print(f"step {{step}} loss={{1 / step}} {LONG_METRIC}={{step}}", flush=True)
open(os.path.join(os.environ["TFRUN_CHECKPOINT_DIR"], {LONG_FILE!r}), "w").write("w")
sys.exit(3)
"""


def test_every_verbs_rows_stay_whole_in_a_pipe(tf: Tfrun, project: Path) -> None:
    """Each verb family's output through a pipe with COLUMNS=40 keeps every line whole, however long: the
    jobs (ps, top --once, status), alerts, metrics --explain, checkpoints, the GPUs, df, rm, the hosts. `top
    --once` cut its rows to 80 columns, and dropped the ID column to fit."""
    tf.home.mkdir(mode=0o700, parents=True)
    (tf.home / "config.toml").write_text('gpus = ["0", "1"]\n')
    job = str(tf.submit("--name", LONG_NAME, str(write_script(project, "long.py", LONG_JOB)), *LONG_ARGS))
    assert tf.run("wait", job).returncode == 3
    tf.env["COLUMNS"] = "40"
    expected = {
        ("ps", "-a"): [f"{LONG_NAME}  failed", f"long.py {' '.join(LONG_ARGS)}"],
        ("top", "--once"): [f"{job}   {LONG_NAME}  failed", f"long.py {' '.join(LONG_ARGS)}", "GPU  NAME"],
        ("status", job): [f"name           {LONG_NAME}"],
        ("alerts",): [f"job {job} ({LONG_NAME}) on "],
        ("metrics", job, "--explain"): [f"step 1 loss=1.0 {LONG_METRIC}=1"],
        ("checkpoints", job): [f"{LONG_FILE}  "],
        ("gpus",): ["GPU  NAME"],
        ("df",): [f"{tf.home} "],
        ("rm", "--dry-run", job): [f"would remove job {job} ("],
    }
    for argv, parts in expected.items():
        shown = subprocess.run(f"{shlex.join([*TFRUN, *argv])} | cat", shell=True, env=tf.env, capture_output=True,
                               text=True)  # fmt: skip
        lines = shown.stdout.splitlines()
        for part in parts:
            assert any(part in line for line in lines), (argv, part, shown.stdout)
        assert "…" not in shown.stdout and "\x1b" not in shown.stdout, (argv, shown.stdout)
    tf.ok("hosts", "add", "box", "alice@gpu-box", "--env", f"TFRUN_HOME=/data/{'h' * 100}")
    assert f"TFRUN_HOME=/data/{'h' * 100}" in tf.ok("hosts", "list")


def test_colour_follows_the_option_then_no_color_then_force_color(tf: Tfrun, project: Path) -> None:
    tf.ok("wait", str(tf.submit(str(write_script(project, "argv.py", ARGV)))))

    plain = {k: v for k, v in tf.env.items() if k not in ("NO_COLOR", "FORCE_COLOR")}

    def coloured(*args: str, **env: str) -> bool:
        result = subprocess.run([*TFRUN, *args, "ps", "-a"], env={**plain, **env}, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 3  # colour or not, one row per job
        return "\x1b[" in result.stdout

    assert not coloured()  # a pipe
    assert coloured("--color", "always")
    assert not coloured("--color", "never", FORCE_COLOR="1")
    assert coloured(FORCE_COLOR="1")
    assert not coloured(FORCE_COLOR="0")
    assert not coloured(NO_COLOR="1", FORCE_COLOR="1")
    assert coloured("--color", "always", NO_COLOR="1")
    bad = tf.run("--color", "sometimes", "ps")
    assert bad.returncode == 2 and "'sometimes' is not one of 'auto', 'always', 'never'" in bad.stderr


def test_ps_q_logs_n_the_newest_job_and_cancel_all(tf: Tfrun, project: Path, gate: Path) -> None:
    nothing = tf.run("logs")
    assert nothing.returncode == 3 and "no jobs on this machine" in nothing.stderr
    write_script(project, "count.py", "for i in range(10):\n    print('line', i)\n")
    write_script(project, "slow.py", gated_job(1, 0, 0, gate))
    done = tf.submit(str(project / "count.py"))
    tf.ok("wait", str(done))
    assert tf.ok("logs", "-n", "2", str(done)) == "line 8\nline 9\n"
    running = [tf.submit("--name", f"slow{i}", str(project / "slow.py")) for i in range(2)]
    assert tf.ok("ps", "-q").split() == [str(job) for job in running]
    assert tf.ok("ps", "-aq").split() == [str(done), *map(str, running)]
    newest = tf.run("logs")
    assert newest.returncode == 0 and newest.stdout.startswith("before 0")
    assert newest.stderr == f"tfrun: job {running[-1]} (slow1), the newest on this machine\n"
    assert tf.ok("status").splitlines()[0].split() == ["id", str(running[-1])]
    both = tf.run("cancel", "--all", "4")
    assert both.returncode == 2 and "JOB... or --all, not both" in both.stderr
    cancelled = tf.run("cancel", "--all", "--grace", "1")
    assert cancelled.returncode == 0, cancelled.stderr
    assert sorted(cancelled.stdout.splitlines()) == sorted(f"job {job} cancelled" for job in running)
    assert tf.ok("ps", "-q") == ""
    again = tf.run("cancel", "--all")
    assert again.returncode == 0 and again.stdout == "" and "no unfinished jobs on this machine" in again.stderr


def test_ps_a_shows_the_newest_hundred_and_says_how_many_it_left_out(tf: Tfrun, project: Path) -> None:
    """A long history does not weigh on `ps -a`: its table shows the newest 100 jobs, a line on stderr says how
    many older ones it left out (so `ps -a | grep` and `| tail -1` see rows only), -n chooses; -q and --json
    still list every job, in --json's format as ever."""
    write_script(project, "nothing.py", "pass\n")
    ids = [int(line) for line in tf.ok("submit", "--array", f"i={','.join(map(str, range(102)))}",
                                       str(project / "nothing.py")).split()]  # fmt: skip
    wait_for(lambda: [job["state"] for job in tf.jobs()] == ["succeeded"] * 102, timeout=300, what="102 jobs ended")
    table = tf.run("ps", "-a")
    rows = table.stdout.splitlines()
    assert rows[2].split()[:3] == [f"{ids[0]}[2-101]", "-", "100"], rows[:3]  # the array's row: what is shown
    assert [row.split()[0] for row in rows[3:]] == [str(job) for job in ids[2:]]
    assert table.stderr == "tfrun: 2 older jobs not shown (-n 0 shows every job)\n"
    every = tf.run("ps", "-a", "-n", "0")
    assert [row.split()[0] for row in every.stdout.splitlines()[3:]] == [str(job) for job in ids] and not every.stderr
    few = tf.run("ps", "-a", "--last", "3")
    assert [row.split()[0] for row in few.stdout.splitlines()[3:]] == [str(job) for job in ids[-3:]]
    assert few.stderr == "tfrun: 99 older jobs not shown (-n 0 shows every job)\n"
    text = tf.ok("ps", "-a", "--json")
    records = json.loads(text)
    assert [record["id"] for record in records] == ids and text == json.dumps(records, indent=2) + "\n"
    assert list(records[0]) == [field.name for field in dataclasses.fields(Job)]
    assert [record["id"] for record in json.loads(tf.ok("ps", "-a", "--json", "-n", "2"))] == ids[-2:]
    assert tf.ok("ps", "-aq").split() == [str(job) for job in ids]
    unfinished = tf.run("ps", "-n", "1")
    assert unfinished.stdout == "no jobs on this machine\n" and not unfinished.stderr


def test_ps_json_reads_an_ended_jobs_kept_text_and_any_write_to_the_job_drops_it(tf: Tfrun, project: Path) -> None:
    """`ps --json` keeps an ended job's record as text the first time it lists it and reads that text from
    then on; a write to the job (a restart names its successor in it), a text of another form, `rm`: each
    lists what the job's row says now, byte for byte as the record made afresh."""
    write_script(project, "nothing.py", "pass\n")
    first, second = (tf.submit(str(project / "nothing.py")) for _ in range(2))
    for job in (first, second):
        tf.ok("wait", str(job))
    made = tf.ok("ps", "-a", "--json")
    db = sqlite3.connect(tf.home / "tfrun.db", isolation_level=None)
    try:
        assert [job_id for (job_id,) in db.execute("SELECT job_id FROM job_texts ORDER BY job_id")] == [first, second]
        assert tf.ok("ps", "-a", "--json") == made  # read from the texts kept
        again = int(tf.ok("restart", str(first)).split()[-1])
        tf.ok("wait", str(again))
        records = json.loads(tf.ok("ps", "-a", "--json"))
        assert [(r["id"], r["restarted_as"]) for r in records] == [(first, again), (second, None), (again, None)]
        expected = json.loads(made)
        expected[0]["restarted_as"] = again
        assert records[:2] == expected  # the rest of the first job's record as it was
        db.execute("UPDATE job_texts SET form = 'an older tfrun', text = '{}' WHERE job_id = ?", (second,))
        assert json.loads(tf.ok("ps", "-a", "--json"))[1] == json.loads(made)[1]
        tf.ok("rm", str(second))
        assert [r["id"] for r in json.loads(tf.ok("ps", "-a", "--json"))] == [first, again]
        assert [job_id for (job_id,) in db.execute("SELECT job_id FROM job_texts ORDER BY job_id")] == [first, again]
    finally:
        db.close()


def test_a_daemon_that_sends_every_job_is_cut_by_the_client() -> None:
    """A tfrund older than `ListJobs.last` ignores it: the client keeps the newest and counts the others."""
    from tfrun.client.views.joblist import newest

    jobs = [Job(i, "succeeded", "a.py", [], [], "/w", "/j", "/l", "/c", 1.0) for i in range(1, 6)]
    assert newest(JobList(jobs), 2) == (jobs[3:], 3)
    assert newest(JobList(jobs[3:], older=3), 2) == (jobs[3:], 3)  # a tfrund that cut it itself
    assert newest(JobList(jobs), None) == (jobs, 0)


def test_ps_json_writes_the_daemons_text_as_it_comes_or_an_older_daemons_records(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfrun.client.cli import main as cli
    from tfrun.client.cli.verbs.jobs import _print_records
    from tfrun.client.views import render

    jobs = [Job(i, "succeeded", "a.py", [], [], "/w", "/j", "/l", "/c", 1.0) for i in range(1, 4)]
    parts = [JobList(more=True, data=b"[\n  {"), JobList(data=b"}\n]")]
    monkeypatch.setattr(cli, "each", lambda asked, take: [take(asked.result(part)) for part in parts])
    _print_records(job_calls.job_list(all=True, text=True), None)
    assert capsys.readouterr().out == "[\n  {}\n]\n"  # the parts as they are, the line ended
    parts = [JobList(jobs)]  # a tfrund older than `text` (and `last`)
    _print_records(job_calls.job_list(all=True, last=2, text=True), 2)
    assert capsys.readouterr().out == render.to_json(jobs[1:]) + "\n"


def test_a_short_option_means_one_thing_in_every_verb() -> None:
    from tfrun.client.cli.main import main

    same = {"--tail": "--last"}  # logs -n N: the last N lines, as alerts -n and metrics -n: the last N
    meanings: dict[str, set[str]] = {}

    def walk(command: click.Command) -> None:
        for param in command.params:
            if isinstance(param, click.Option):
                longs = [o for o in param.opts if o.startswith("--")]
                for short in (o for o in param.opts + param.secondary_opts if not o.startswith("--")):
                    meanings.setdefault(short, set()).add(same.get(longs[0], longs[0]) if longs else short)
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                walk(sub)

    walk(main)
    assert {short: longs for short, longs in meanings.items() if len(longs) > 1} == {}
    assert meanings["-n"] == {"--last"}


def completions(tf: Tfrun, words: str, timeout: float = 30) -> list[tuple[str, str]]:
    """What tfrun offers for the last word of `words`, asked the way click's bash script asks."""
    env = {**tf.env, "_TFRUN_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split(" ")) - 1)}  # fmt: skip
    result = subprocess.run(TFRUN, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [tuple(line.split(",", 1)) for line in result.stdout.splitlines() if line]  # type: ignore[misc]


@local_and_ssh
def test_completion_offers_job_ids_hosts_and_files(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    jobs = [tf.submit(str(write_script(project, "argv.py", ARGV))) for _ in range(2)]
    for job in jobs:
        tf.ok("wait", str(job))
    assert completions(tf, "tfrun logs ") == [("plain", str(job)) for job in reversed(jobs)]
    assert completions(tf, f"tfrun status {jobs[1]}") == [("plain", str(jobs[1]))]
    assert completions(tf, "tfrun submit ") == [("file", "")]
    assert completions(tf, "tfrun submit tr") == [("file", "tr")]
    source = tf.ok("completion", "bash")
    for verb, offered in (("logs", [str(job) for job in jobs]), ("cancel", [])):  # cancel: the unfinished only
        # bash calls the function with the command's name; click's function runs it to ask for the words
        words = f'COMP_WORDS=(tfrun {verb} ""); COMP_CWORD=2; _tfrun_completion {TFRUN[0]}; echo "${{COMPREPLY[@]}}"'
        bash = subprocess.run(["bash", "-c", f"{source}\n{words}"], env=tf.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert bash.returncode == 0 and sorted(bash.stdout.split()) == offered, bash.stderr
    if not tf.remote:
        tf.ok("hosts", "add", "gpu-box", "alice@gpu-box")  # the default host from now on
    hosts = completions(tf, "tfrun ps --host ")
    assert ("plain", "local") in hosts and ("plain", "box" if tf.remote else "gpu-box") in hosts
    started = time.monotonic()
    assert completions(tf, "tfrun --color never logs --host nobody@127.0.0.1:1 ") == []  # nothing there: silence
    assert time.monotonic() - started < 10
    for shell in ("zsh", "fish"):
        assert "_TFRUN_COMPLETE" in tf.ok("completion", shell)


def test_completion_of_a_local_box_never_starts_its_daemon(tf: Tfrun) -> None:
    assert completions(tf, "tfrun logs ") == []
    assert not (tf.home / "run" / "tfrund.lock").exists() or tf.daemon("status").returncode != 0
