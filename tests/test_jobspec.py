"""A job's spec as the store keeps it (runner/records/job.py): the JSON of older tfrunds reads back, and this one writes
what they wrote, key for key, so a daemon can be upgraded or downgraded over a home with jobs in it."""

from __future__ import annotations

import json

from tfrun.protocol.fields import CAUSES
from tfrun.runner.records.job import JobSpec, from_json

# As tfrund 0.1 (schema 5) stored the spec of `tfrun submit --gpus 1 --after 3 train.py --lr 0.1`.
STORED = (
    '{"source": "/home/a/proj", "script": "train.py", "args": ["--lr", "0.1"], "command": ["/usr/bin/python3", '
    '"train.py", "--lr", "0.1"], "env": {"A": "1"}, "git_commit": "abc123", "git_dirty": false, "files": 12, '
    '"bytes": 3456, "max_restarts": 2, "gpus": 1, "priority": 0, "after": [3], "tty": false}'
)


def test_a_stored_spec_reads_back_and_is_written_as_it_was() -> None:
    spec = from_json(STORED)
    assert spec.args == ("--lr", "0.1") and spec.after == (3,) and spec.gpus == 1 and spec.max_restarts == 2
    assert spec.to_json() == STORED


def test_a_restart_adds_restart_of_last_and_keeps_the_rest() -> None:
    again = from_json(STORED).rerun(of=7, max_restarts=1)
    assert again.restart_of == 7 and again.max_restarts == 1
    data = json.loads(again.to_json())
    added = ("restart_of", "restarts")  # restarts: the automatic restarts so far
    assert tuple(data)[-2:] == added and {k: v for k, v in data.items() if k not in added} == {
        **json.loads(STORED),
        "max_restarts": 1,
    }
    assert from_json(again.to_json()) == again


def test_an_older_spec_without_newer_keys_takes_their_defaults_and_unknown_keys_are_ignored() -> None:
    old = {"script": "train.py", "args": [], "command": ["python3", "train.py"], "env": {}, "from_the_future": 1}
    spec = from_json(json.dumps(old))
    # but restart_on: a job stored before --restart-on keeps what it was submitted with, restarts after any failure
    assert spec == JobSpec(script="train.py", args=(), command=("python3", "train.py"), env={}, restart_on=CAUSES)
    assert (spec.gpus, spec.priority, spec.after, spec.tty, spec.max_restarts, spec.restart_of) == (
        0,
        0,
        (),
        False,
        0,
        None,
    )


def test_a_new_specs_restart_policy_and_count_are_stored_and_read_back() -> None:
    spec = JobSpec(script="t.py", args=(), command=("python3", "t.py"), env={}, max_restarts=3)
    data = json.loads(spec.to_json())
    assert data["restart_on"] == ["lost", "oom", "signal"] and "restarts" not in data
    again = spec.rerun(of=1, max_restarts=2)  # an automatic restart counts; a tfrun restart does not
    assert (again.restarts, spec.rerun(of=1).restarts) == (1, 0)
    assert from_json(again.to_json()) == again and json.loads(again.to_json())["restarts"] == 1
