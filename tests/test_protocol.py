"""The wire format: every message survives a round trip, and malformed frames are refused, not crashed on."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest
from harness import Tfrun

from tfrun.private import private_key
from tfrun.protocol.channel import Channel, Unproven
from tfrun.protocol.fields import validate_name
from tfrun.protocol.jobs import Cancel, CancelReply, CancelResult, Job, JobList, JobReply, ListJobs, record_text
from tfrun.protocol.logs import LogChunk
from tfrun.protocol.proof import KEY_BYTES
from tfrun.protocol.submit import FileEntry, Submit
from tfrun.protocol.wire import Hello, ProtocolError, decode_header, encode, read_message


def read_from(data: bytes) -> object:
    """The first message in `data`, read as the daemon reads a socket."""

    async def read() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_message(reader)

    return asyncio.run(read())


def roundtrip(msg: object) -> object:
    return read_from(encode(msg))  # type: ignore[arg-type]


def sample_job() -> Job:
    return Job(
        id=7, state="running", script="train.py", args=["--lr", "0.1"], command=["python3", "train.py"],
        workdir="/w", job_dir="/j", log_path="/j/output.log", checkpoint_dir="/c", created_at=1.5,
        name="résumé", env={"A": "1"},
    )  # fmt: skip


@pytest.mark.parametrize(
    "msg",
    [
        Hello(protocol=2, version="0.1.0", role="client"),
        Submit(
            files=[
                FileEntry("a b", "dir", mode=0o755),
                FileEntry("a b/train.py", "file", size=3, digest="0" * 64),
                FileEntry("caf\udce9", "symlink", target="/data/\udcff"),  # names that are not UTF-8
            ],
            script="a b/train.py",
            args=["-x", "--", "ünï", "\udcfe"],
            env={"K": "v=1"},
        ),
        Cancel(jobs=["3", "name"], grace=0.5),
        JobReply(sample_job()),
        CancelReply([CancelResult(job="3", ok=True, message="done", id=3, state="cancelled")]),
        LogChunk(offset=10, data=b"\xff\x00\r\nloss: 0.1\x1b[0m"),
        LogChunk(offset=0, data=b""),
    ],
)
def test_every_kind_of_message_round_trips(msg: object) -> None:
    assert roundtrip(msg) == msg


def test_a_record_as_text_is_what_ps_json_prints_for_it() -> None:
    """The daemon sends a long listing as text (`ListJobs.text`): each record must read exactly as the client's
    own JSON of it, for every kind of value a field holds."""
    from tfrun.client.views import render

    odd = Job(
        id=12, state="failed", script='we"ird\\.py', args=["--x=\n\t", "\udcfe", "ünï", "{[,]}"], command=[],
        workdir="/w", job_dir="/j", log_path="/j/output.log", checkpoint_dir="/c", created_at=1700000000.1234567,
        name=None, env={"K": "v=1", "É": "\x1b[0m"}, started_at=5.0, finished_at=1e-7, exit_code=-9, signal=9,
        git_dirty=False, tty=True, gpus=["0", "1"], after=[3, 4], restart_on=[], alert_rules=["stall=30m"],
        array_id=12, array_index=0, port=6006,
    )  # fmt: skip
    for jobs in ([sample_job()], [sample_job(), odd]):
        assert "[\n" + ",\n".join(map(record_text, jobs)) + "\n]" == render.to_json(jobs)


def test_a_listing_in_parts_round_trips_and_an_older_request_still_reads() -> None:
    part = JobList(older=3, more=True, data=b'[\n  {\n    "id": 1\n  }')
    assert roundtrip(part) == part
    assert roundtrip(JobList([sample_job()])) == JobList([sample_job()])
    cls, fields, _ = decode_header(b'{"type": "list", "all": true}')  # a client before `last` and `text`
    assert cls(**fields) == ListJobs(all=True, last=None, text=False)


def test_bytes_travel_raw_after_the_header() -> None:
    frame = encode(LogChunk(offset=3, data=b"\n\n{raw}\n"))
    header, payload = frame.split(b"\n", 1)
    assert json.loads(header) == {"type": "log_chunk", "offset": 3, "size": 8}
    assert payload == b"\n\n{raw}\n"


@pytest.mark.parametrize(
    "line, complaint",
    [
        (b"not json\n", "not JSON"),
        (b"[1, 2]\n", "no message type"),
        (b'{"type": "launch_missiles"}\n', "unknown message type"),
        (b'{"type": "submit", "script": "x"}\n', "missing field 'files'"),
        (b'{"type": "submit", "files": [], "script": 5}\n', "submit.script: expected a string"),
        (b'{"type": "submit", "files": [{"path": "a"}], "script": "a"}\n', r"submit.files\[0\]: missing field 'kind'"),
        (b'{"type": "cancel", "jobs": "3"}\n', "expected a list"),
        (b'{"type": "read_log", "job": "1", "offset": true}\n', "expected an integer"),
        (b'{"type": "submit", "files": [], "script": "x", "env": {"A": 1}}\n', "expected a string"),
        (b'{"type": "log_chunk", "offset": 0, "size": -1}\n', "payload size"),
        (b'{"type": "log_chunk", "offset": 0, "size": 99999999999}\n', "payload size"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(line: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        decode_header(line)


def test_a_job_state_is_one_of_the_states() -> None:
    header = json.loads(encode(JobReply(sample_job())).split(b"\n")[0])
    header["job"]["state"] = "paused"
    with pytest.raises(ProtocolError, match=r"job\.state: expected one of queued, running, succeeded, failed"):
        decode_header(json.dumps(header).encode())


def test_oversized_values_are_refused() -> None:
    too_many = json.dumps({"type": "cancel", "jobs": ["1"] * (1 << 20 | 1)})
    with pytest.raises(ProtocolError, match="more than"):
        decode_header(too_many.encode())
    too_long = json.dumps({"type": "get", "job": "x" * 100_000})
    with pytest.raises(ProtocolError, match="longer than"):
        decode_header(too_long.encode())


def test_unknown_fields_are_ignored_so_peers_can_grow() -> None:
    cls, fields, size = decode_header(b'{"type": "get", "job": "4", "future": [1]}')
    assert cls.__name__ == "GetJob" and fields == {"job": "4"} and size == 0


def test_a_frame_cut_short_is_an_error_but_a_clean_close_is_not() -> None:
    assert read_from(b"") is None
    with pytest.raises(ProtocolError, match="middle of a payload"):
        read_from(encode(LogChunk(offset=0, data=b"12345"))[:-2])
    with pytest.raises(ProtocolError, match="middle of a frame"):
        read_from(b'{"type": "get"')


@pytest.mark.parametrize(
    "name, ok", [("bert-ft", True), ("12", False), ("a b", False), ("", False), ("x" * 200, False)]
)
def test_job_names_never_look_like_ids(name: str, ok: bool) -> None:
    assert (validate_name(name) is None) is ok


def test_the_daemon_registers_and_handles_every_request_of_the_protocol_package() -> None:
    """The protocol is a package whose message modules register their tags when imported, and a verb imports
    only those it asks with. The daemon must know every request all the same: in a fresh interpreter, what
    importing the daemon registers is compared with every class the package's modules define."""
    import subprocess
    import sys

    script = """
import importlib, json, pkgutil
import tfrun.protocol, tfrun.runner.daemon
from tfrun.protocol.wire import _REGISTRY, Message, Request
from tfrun.runner.handlers import HANDLERS
seen = dict(_REGISTRY)
defined = {}
for info in pkgutil.iter_modules(tfrun.protocol.__path__):
    module = importlib.import_module(f"tfrun.protocol.{info.name}")
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, Message) and value.__module__ == module.__name__:
            if value.TYPE:
                assert defined.setdefault(value.TYPE, value) is value, value.TYPE
print(json.dumps({
    "defined": len(defined),
    "unregistered": sorted(set(defined) - set(seen)),
    "unhandled": sorted(t for t, c in defined.items() if issubclass(c, Request) and c not in HANDLERS),
}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    found = json.loads(result.stdout)
    assert found["unregistered"] == [], "messages the daemon never imports"
    assert found["unhandled"] == [], "requests without a handler"
    assert found["defined"] >= 50  # the package was walked (52 messages today), not an empty folder


def test_a_daemon_proves_its_key_and_a_wrong_key_is_refused(tf: Tfrun) -> None:
    """Issue 44, finding 1: the proof the SSH fast path asks of a remembered socket, against a real daemon. Its
    key (run/tfrund.key, 0600) proves it; any other key, or no answer with a proof, is Unproven."""
    tf.ok("ps")  # starts the daemon

    async def hello(key: bytes) -> Channel:
        reader, writer = await asyncio.open_unix_connection(str(tf.home / "run" / "tfrund.sock"))
        try:
            return await Channel.open(reader, writer, key)
        finally:
            writer.close()

    with pytest.raises(Unproven):
        asyncio.run(hello(bytes(KEY_BYTES)))
    key_file = tf.home / "run" / "tfrund.key"  # made at the first challenge
    key = bytes.fromhex(key_file.read_text())
    assert (len(key), key_file.stat().st_mode & 0o777) == (KEY_BYTES, 0o600)
    assert asyncio.run(hello(key)).daemon.proof


@pytest.mark.parametrize("planted", ["fifo", "symlink", "short", "open to others"])
def test_a_daemon_key_that_is_not_a_private_file_is_made_anew(tmp_path: Path, planted: str) -> None:
    """What sits at the key's name (a FIFO that would block an open, a link, a file cut short by a crash, one
    others may read) is replaced by a fresh private key, at once, and a good key is kept."""
    path = tmp_path / "tfrund.key"
    if planted == "fifo":
        os.mkfifo(path)
    elif planted == "symlink":
        (tmp_path / "elsewhere").write_text("ab" * KEY_BYTES)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("ab" * (KEY_BYTES // 2 if planted == "short" else KEY_BYTES))
        path.chmod(0o644 if planted == "open to others" else 0o600)
    key = private_key(path, KEY_BYTES)
    assert len(key) == KEY_BYTES and key != bytes.fromhex("ab" * KEY_BYTES)
    assert stat.S_ISREG(path.lstat().st_mode) and path.stat().st_mode & 0o777 == 0o600
    assert private_key(path, KEY_BYTES) == key, "a good key is kept"
