"""Hostile requests straight on the daemon's socket: every one is refused or served, none is an internal error,
and no client can hold up the others."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import typing
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Tfrun, write_script
from harness.abuse import Raw, abusive_requests, describe, header_line, ps_latencies, socket_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrun.constants import MAX_CANCEL_JOBS, MAX_NAME, MAX_NODES, MAX_PATTERN_CHARS, MAX_PATTERNS
from tfrun.protocol.admin import Shutdown
from tfrun.protocol.fields import UTF8, Limit, Range
from tfrun.protocol.wire import _REGISTRY
from tfrun.runner.handlers import HANDLERS

pytestmark = [pytest.mark.slow]

FUZZ_EXAMPLES = 10_000


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tfrun]:
    """A daemon with one ended job ("1", named "fuzzjob") and a log, for requests that find it."""
    root = tmp_path_factory.mktemp("fuzz")
    tf = Tfrun(root / "home")
    tf.env["TFRUN_JOB_PYTHON"] = "/bin/true"  # `doctor` probes the job interpreter: keep that quick
    project = root / "project"
    project.mkdir()
    lines = "#!/bin/sh\nfor i in $(seq 300); do echo step $i loss=0.$i; done\n"
    write_script(project, "run.sh", lines, executable=True)
    job = tf.submit("--name", "fuzzjob", str(project / "run.sh"))
    tf.ok("wait", str(job))
    yield tf
    tf.cleanup()


def daemon_log(tf: Tfrun) -> str:
    return (tf.home / "tfrund.log").read_text(errors="replace")


# -- values -------------------------------------------------------------------------------------------------

REFS = ["1", "fuzzjob", "0", "²", "①", "١٢", "9" * 31, str(2**63), "-1", "1.0", " 1", "a\x00b", "x" * 128]

any_text = st.text(st.characters(blacklist_categories=()), max_size=40)  # surrogates and control characters too
hostile_ints = st.sampled_from([-1, -(2**63) - 1, 2**63, 2**64, 10**30, -(10**30), 10**300, 2**31, 0o10000])
hostile_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e308, -1e308, 10**400])
hostile_texts = st.sampled_from(
    ["²", "①", "\U0001d7d9\U0001d7da", "\udcff", "\ud800x", "x" * 70_000, "9" * 5000, "", "\x00", "../.."]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
hostile = (
    json_values
    | hostile_ints
    | hostile_floats
    | hostile_texts
    | st.sampled_from([["1"] * (MAX_CANCEL_JOBS + 1), [[[[[]]]]]])
)


# Values that get a request past the first checks of its handler, by field name.
SOUND = {
    "job": st.sampled_from(["1", "fuzzjob"]) | st.sampled_from(REFS),
    "kind": st.sampled_from(["file", "dir", "symlink"]),
    "digest": st.sampled_from(["0" * 64, hashlib.sha256(b"").hexdigest()]),
    "path": st.sampled_from(["output.log", "work", "work/run.sh", "checkpoints", "a/b", "spec.json"]),
}
SOUND["jobs"] = SOUND["after"] = SOUND["job"]
SOUND["digests"] = SOUND["digest"]


def shaped(tp: Any, name: str, chaos: bool) -> st.SearchStrategy[Any]:
    """Values of the declared type, often at its bounds; with `chaos`, what they hold may be hostile too."""
    extras: tuple[Any, ...] = ()
    if typing.get_origin(tp) is typing.Annotated:
        tp, *rest = typing.get_args(tp)
        extras = tuple(rest)
    bounds = next((e for e in extras if isinstance(e, Range)), None)
    limit = next((e for e in extras if isinstance(e, Limit)), Limit())
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin is typing.Union:
        return st.none() | field(next(a for a in typing.get_args(tp) if a is not type(None)), name, chaos)
    if origin is list:
        return st.lists(field(typing.get_args(tp)[0], name, chaos), max_size=min(6, limit.items))
    if origin is dict:
        keys = any_text if chaos else st.text(max_size=8)
        return st.dictionaries(keys, field(typing.get_args(tp)[1], name, chaos), max_size=4)
    if tp is bool:
        return st.booleans()
    if tp is int:
        low, high = (int(bounds.low), int(bounds.high)) if bounds else (-(2**63), 2**63 - 1)
        small = st.integers(max(low, -3), min(high, 300))
        return small | small | st.integers(low, high) | st.sampled_from([low, high])
    if tp is float:
        least, most = (bounds.low, bounds.high) if bounds else (-1e12, 1e12)
        return st.floats(least, min(most, 1e12))
    if tp is str:
        return SOUND.get(name, st.nothing()) | (st.text(max_size=40) if UTF8 in extras else any_text)
    if dataclasses.is_dataclass(tp):
        return record(tp, chaos)
    raise TypeError(tp)


def field(tp: Any, name: str, chaos: bool) -> st.SearchStrategy[Any]:
    return st.one_of(shaped(tp, name, chaos), shaped(tp, name, chaos), hostile) if chaos else shaped(tp, name, chaos)


def record(cls: Any, chaos: bool) -> st.SearchStrategy[dict[str, Any]]:
    """The fields of `cls`: those it requires, and any of the others."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [f for f in dataclasses.fields(cls) if hints[f.name] is not bytes]
    required = [f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING]
    return st.fixed_dictionaries(
        {name: field(hints[name], name, chaos) for name in required},
        optional={f.name: field(hints[f.name], f.name, chaos) for f in fields if f.name not in required},
    )


# What each request is answered with, besides an `Error`.
ANSWERS = {
    "attach": ["attach_reply"], "cancel": ["cancelled"], "daemon_status": ["daemon_info"], "doctor": ["doctor_report"],
    "get": ["job"], "get_metrics": ["metrics"], "explain_metrics": ["metrics_explained"], "get_gpu_use": ["gpu_use"],
    "get_losses": ["losses"],
    "have_blobs": ["missing_blobs"], "list": ["jobs"],
    "list_alerts": ["alerts"], "list_files": ["file_list"], "list_gpus": ["gpus"], "notify_test": ["notify_report"],
    "put_blob": ["ok"], "put_blobs": ["ok"], "read_file": ["file_chunk"],
    "read_log": ["log_chunk", "log_lines", "log_end"], "restart": ["job"], "submit": ["job"], "submit_array": ["jobs"],
    "top": ["top_reply"], "start_service": ["service"], "check_service": ["service"], "get_daemon_key": ["daemon_key"],
    "wait": ["job"], "get_config": ["config"], "reload_config": ["config"], "set_config": ["config"],
    "remove": ["remove_reply"], "prune": ["remove_reply"], "disk_usage": ["disk_report"],
    "list_stored": ["stored_reply"], "resume": ["job"],
}  # fmt: skip
# Every request but the one that stops the daemon.
REQUESTS = sorted((cls for cls in _REGISTRY.values() if cls in HANDLERS and cls is not Shutdown), key=lambda c: c.TYPE)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    """(its type, a whole frame) of a request of any type: in range but for one hostile field, or hostile
    throughout, or in range throughout (so that handlers see values at their bounds)."""
    cls = draw(st.sampled_from(REQUESTS))
    mode = draw(st.sampled_from(["one", "one", "all", "none", "missing"]))
    fields = draw(record(cls, chaos=mode == "all"))
    names = [f.name for f in dataclasses.fields(typing.cast(Any, cls)) if f.type != "bytes"]
    if mode == "one" and names:
        fields[draw(st.sampled_from(names))] = draw(hostile)
    if mode == "missing" and fields:
        del fields[draw(st.sampled_from(sorted(fields)))]
    if cls.TYPE == "submit" and isinstance(fields.get("files"), list):  # never a job that really runs
        fields["script"] = "not-among-the-files"
    if cls.TYPE == "submit_array" and isinstance(fields.get("submit"), dict):  # nor an array of them
        fields["submit"]["script"] = "not-among-the-files"
    if cls.TYPE == "start_service":  # never a TensorBoard or Jupyter that really runs (nor waits 3 min to)
        fields["jobs"], fields["root_dir"] = ["no-such-job"], "/no/such/folder"
    if cls.TYPE in ("remove", "prune"):  # the box's job stays, for the requests that find it
        fields["dry_run"] = True
    payload = b""
    if any(f.type == "bytes" for f in dataclasses.fields(typing.cast(Any, cls))):
        payload = draw(st.binary(max_size=64))
        fields["size"] = draw(st.sampled_from([len(payload)] * 4 + [-1, 2**40, "x"]))
    return cls.TYPE, header_line({"type": cls.TYPE, **fields}) + payload


# -- tests --------------------------------------------------------------------------------------------------


def test_every_request_type_takes_hostile_values_without_an_internal_error(box: Tfrun) -> None:
    raw = Raw(socket_path(box))
    seen: Counter[str] = Counter()
    refused: Counter[str] = Counter()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(requests())
    def fuzz(request: tuple[str, bytes]) -> None:
        kind, frame = request
        seen[kind] += 1
        replies = raw.replies(frame)
        internal = [r for r in replies if r.get("code") == "internal"]
        assert not internal, f"{frame[:300]!r} -> {internal}"
        assert {r["type"] for r in replies} <= {"error", *ANSWERS[kind]}, f"{frame[:300]!r} -> {replies[:3]}"
        refused[kind] += not replies or replies[0]["type"] == "error"

    started = time.monotonic()
    fuzz()
    print(f"\n{sum(seen.values())} requests in {time.monotonic() - started:.1f}s; per type (refused): "
          + ", ".join(f"{k} {n} ({refused[k]})" for k, n in sorted(seen.items())))  # fmt: skip
    assert set(seen) == {cls.TYPE for cls in REQUESTS}
    raw.connect()
    assert raw.replies(b"") == []  # still answering
    assert "Traceback" not in daemon_log(box) and "request failed" not in daemon_log(box)
    assert box.ok("status", "1")


@pytest.mark.parametrize(
    "fields, complaint",
    [
        ({"type": "get", "job": "\udcff"}, "get.job: not UTF-8 text"),
        ({"type": "read_log", "job": "1", "tail": 10**30}, "read_log.tail: out of range"),
        ({"type": "read_log", "job": "1", "offset": -1}, "read_log.offset: out of range"),
        ({"type": "read_log", "job": "1", "task": -1}, "read_log.task: out of range"),
        ({"type": "read_log", "job": "1", "task": MAX_NODES}, "read_log.task: out of range"),
        ({"type": "read_file", "job": "1", "path": "output.log", "offset": -1}, "read_file.offset: out of range"),
        ({"type": "read_file", "job": "1", "path": "output.log", "offset": 10**30}, "read_file.offset: out of range"),
        ({"type": "cancel", "jobs": ["1"], "grace": float("nan")}, "cancel.grace: expected a finite number"),
        ({"type": "cancel", "jobs": ["1"], "grace": 10**400}, "cancel.grace: out of range"),
        ({"type": "read_log", "job": "1", "since": float("inf")}, "read_log.since: expected a finite number"),
        (
            {"type": "submit", "script": "a", "files": [{"path": "a", "kind": "file", "mode": -1}]},
            r"submit.files[0].mode: out of range",
        ),
        (
            {"type": "submit", "script": "a", "files": [{"path": "a", "kind": "file", "size": 2**64}]},
            r"submit.files[0].size: out of range",
        ),
        ({"type": "submit", "script": "a", "files": [], "name": "\udcff"}, "submit.name: not UTF-8 text"),
        ({"type": "doctor", "python": "/\x00"}, "doctor.python: holds a NUL byte"),  # it was an internal error
        ({"type": "submit", "script": "a", "files": [], "args": ["-", "a\x00"]}, "submit.args[1]: holds a NUL byte"),
        ({"type": "cancel", "jobs": ["1"] * (MAX_CANCEL_JOBS + 1)}, f"more than {MAX_CANCEL_JOBS} items"),
        ({"type": "read_log", "job": "1", "patterns": ["x"] * (MAX_PATTERNS + 1)}, f"more than {MAX_PATTERNS} items"),
        (
            {"type": "read_log", "job": "1", "patterns": ["x" * 1000] * (MAX_PATTERN_CHARS // 1000 + 1)},
            f"more than {MAX_PATTERN_CHARS} characters together",
        ),
        ({"type": "top", "recent": 10**9}, "top.recent: out of range"),
        ({"type": "list", "before": -1}, "list.before: out of range"),
        ({"type": "list", "before": 2**64}, "list.before: out of range"),
        ({"type": "list", "states": ["failed", "everything"]}, "list.states[1]: expected one of queued, running"),
        ({"type": "list", "states": ["failed"] * 7}, "list.states: more than 6 items"),
        ({"type": "list", "match": "x" * (MAX_NAME + 1)}, f"list.match: longer than {MAX_NAME} characters"),
        ({"type": "list", "match": "\udcff"}, "list.match: not UTF-8 text"),
        ({"type": "list", "match": ["a"]}, "list.match: expected a string"),
    ],
)
def test_values_out_of_their_declared_range_are_refused_naming_the_field(
    box: Tfrun, fields: dict[str, Any], complaint: str
) -> None:
    raw = Raw(socket_path(box))
    replies = raw.replies(header_line(fields))
    assert [(r["type"], r["code"]) for r in replies] == [("error", "bad_request")], replies
    assert complaint in replies[0]["message"]


def test_refs_that_name_no_job_are_no_job_errors(box: Tfrun) -> None:
    raw = Raw(socket_path(box))
    for ref in ["1000000000000000000000000000000", "²", "①", "\u0661", str(2**63)]:
        replies = raw.replies(header_line({"type": "get", "job": ref}))
        assert [(r["type"], r["code"], r["message"]) for r in replies] == [("error", "no_such_job", f"no job {ref!r}")]


def test_deeply_nested_json_is_a_bad_request_logged_once_without_a_traceback(box: Tfrun) -> None:
    raw = Raw(socket_path(box))
    before = daemon_log(box).count("nested too deeply")
    for _ in range(3):
        replies = raw.replies(b"[" * 100_000 + b"\n")
        assert [(r["type"], r["code"]) for r in replies] == [("error", "bad_request")]
        assert "nested too deeply" in replies[0]["message"]
        replies = raw.replies(header_line({"type": "get", "job": "1", "x": 0}).replace(b"0", b"[" * 100_000))
        assert [(r["type"], r["code"]) for r in replies] == [("error", "bad_request")]
    log = daemon_log(box)
    assert log.count("nested too deeply") - before == 6 and "Traceback" not in log


def test_reading_a_folder_as_a_file_is_refused_and_leaks_nothing(box: Tfrun) -> None:
    raw = Raw(socket_path(box))
    pid = box.daemon_pid()
    raw.connect()
    open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    for _ in range(50):
        replies = raw.replies(header_line({"type": "read_file", "job": "1", "path": "work"}))
        assert [(r["code"], r["message"]) for r in replies] == [("invalid_input", "work is not a file")]
    replies = raw.replies(header_line({"type": "read_file", "job": "1", "path": "output.log", "offset": 10**12}))
    assert [r["code"] for r in replies] == ["invalid_input"] and "past the end" in replies[0]["message"]
    assert len(os.listdir(f"/proc/{pid}/fd")) <= open_fds


# -- one client must not stall the others ----------------------------------------------------------------------


def test_an_abusive_client_is_bounded_and_others_keep_being_answered(box: Tfrun) -> None:
    stop = threading.Event()
    answers: Counter[str] = Counter()
    failures: list[str] = []

    def abuse() -> None:
        raw = Raw(socket_path(box))
        while not stop.is_set():
            for frame, expected in abusive_requests():
                replies = raw.replies(frame)
                errors = [r.get("code", "") for r in replies if r["type"] == "error"]
                answers[expected or "served"] += 1
                if errors != ([expected] if expected else []):
                    failures.append(f"{frame[:80]!r}: {replies[:2]}")

    thread = threading.Thread(target=abuse)
    thread.start()
    try:
        latencies = ps_latencies(box, seconds=8)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:3]
    assert answers["bad_request"] >= 2 and answers["served"] >= 2, answers
    print(f"\nps under abuse: {describe(latencies)}; abusive requests answered: {dict(answers)}")
