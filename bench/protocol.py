#!/usr/bin/env python3
"""msgspec against tfrun's protocol layer (issue 47), side by side in one run. Run by hand.

    .venv/bin/pip install msgspec      # not a dependency of tfrun: only this benchmark needs it
    .venv/bin/python -m bench.protocol [--runs 7] [--starts 20] [--no-wheels]

The msgspec side is today's messages as msgspec Structs made from the same declarations (`struct_for`: each
`Range` a `Meta(ge=, le=)`, each `Limit` a `Meta(max_length=)`, tagged with `tag_field="type"` and the TYPE
strings), so that both sides hold the same bounds and decode the same bytes: the frames `wire.encode` makes.
Bounds that `Meta` cannot say are printed, not hidden. Prints Markdown tables of:
  - decode+check and encode of each representative message, medians of --runs, msgspec / today; whether
    msgspec's frame is today's byte for byte, and whether today's decoder (an old peer) reads it as the same;
    last, a reply with a NaN loss through Python's json around msgspec (which reads no NaN and writes null);
  - the one-line error a bad field gives in each, and what each does with frames today's peers send;
  - start: `import` of a verb's protocol, of msgspec, and both, in fresh interpreters;
  - the wheels: msgspec's for this platform (pip download) and tfrun's own (built from HEAD), and installed size.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import functools
import hashlib
import importlib
import json
import math
import os
import pkgutil
import statistics
import subprocess
import sys
import tempfile
import time
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import tfrun.protocol
from bench.timing import stats, timed
from tests.harness.paths import REPO
from tfrun.constants import MAX_ENV, MAX_INT64, MAX_PAYLOAD_BYTES, MAX_STRING
from tfrun.protocol.fields import NO_NUL, NON_FINITE, UTF8, Limit, Range, bytes_field
from tfrun.protocol.jobs import Cancel, Job, JobList
from tfrun.protocol.logs import ReadLog
from tfrun.protocol.submit import FileEntry, HaveBlobs, PutBlobs, Submit
from tfrun.protocol.watching import MetricSample, MetricsReply
from tfrun.protocol.wire import Message, ProtocolError, decode_header, encode, plain

# Imported by name, not `import msgspec`: it is no dependency of tfrun, and `mypy bench` (tests/test_codebase.py)
# must pass where it is not installed. The Structs are made with `defstruct` for the same reason (no subclass of
# an unknown base).
try:
    msgspec: Any = importlib.import_module("msgspec")
except ImportError:
    sys.exit("bench.protocol needs msgspec: .venv/bin/pip install msgspec")

SAMPLE_SECONDS = 0.05  # each timing sample repeats the call until it lasts this long (a 2 µs decode too)


def _stripped(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """(the type, its Annotated extras)."""
    if typing.get_origin(tp) is Annotated:
        inner, *extras = typing.get_args(tp)
        return inner, tuple(extras)
    return tp, ()


class Translator:
    """Today's field declarations (tfrun/protocol/fields.py) as msgspec types with the same bounds; `lost` names
    those `Meta` cannot hold, found as they are met."""

    def __init__(self) -> None:
        self.structs: dict[type[Any], Any] = {}
        self.lost: dict[str, set[str]] = {}

    def struct_for(self, cls: type[Any]) -> Any:
        """The Struct of a message (tagged with its TYPE) or a record (untagged), fields in the same order."""
        found = self.structs.get(cls)
        if found is not None:
            return found
        hints = typing.get_type_hints(cls, include_extras=True)
        spec: list[tuple[str, Any, Any]] = []
        for f in dataclasses.fields(cls):
            if hints[f.name] is bytes:  # its bytes travel after the header, their length in "size" as today
                spec.append(("size", Annotated[int, msgspec.Meta(ge=0, le=MAX_PAYLOAD_BYTES)], 0))
                continue
            kind = self.translated(hints[f.name], f"{cls.__name__}.{f.name}")
            if f.default_factory is not dataclasses.MISSING:
                spec.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
            elif f.default is not dataclasses.MISSING:
                spec.append((f.name, kind, f.default))
            else:
                spec.append((f.name, kind, msgspec.NODEFAULT))
        tag = getattr(cls, "TYPE", "") or None
        found = self.structs[cls] = msgspec.defstruct(
            cls.__name__, spec, tag=tag, tag_field="type" if tag else None, kw_only=True
        )
        return found

    def translated(self, tp: Any, where: str) -> Any:
        tp, extras = _stripped(tp)
        bounds = next((e for e in extras if isinstance(e, Range)), None)
        limit = next((e for e in extras if isinstance(e, Limit)), Limit())
        origin = typing.get_origin(tp)
        if origin is Union:
            return Optional[self.translated(next(a for a in typing.get_args(tp) if a is not type(None)), where)]
        if origin is Literal or tp is bool:
            return tp
        if origin is list:
            if limit.chars is not None:
                self._lose("characters of a list's strings together (Limit.chars on a list)", where)
            item = self.translated(typing.get_args(tp)[0], where)
            return Annotated[list[item], msgspec.Meta(max_length=limit.items)]  # type: ignore[valid-type]
        if origin is dict:
            value = self.translated(typing.get_args(tp)[1], where)
            key = Annotated[str, msgspec.Meta(max_length=MAX_STRING)]
            return Annotated[dict[key, value], msgspec.Meta(max_length=MAX_ENV)]  # type: ignore[valid-type]
        if tp is int:
            low, high = (bounds.low, bounds.high) if bounds else (-MAX_INT64 - 1, MAX_INT64)
            return Annotated[int, msgspec.Meta(ge=low, le=high)]
        if tp is float:
            if NON_FINITE in extras:
                self._lose("NaN and infinities (NON_FINITE): msgspec reads no NaN, writes null", where)
            if bounds is None:
                return float
            upper = {} if math.isinf(bounds.high) else {"le": bounds.high}
            return Annotated[float, msgspec.Meta(ge=bounds.low, **upper)]
        if tp is str:
            if UTF8 not in extras:
                self._lose("surrogate escapes (a name that is not UTF-8): msgspec refuses them", where)
            chars = MAX_STRING if limit.chars is None else limit.chars
            if NO_NUL in extras:  # a pattern keeps the bound, at a regex a value
                return Annotated[str, msgspec.Meta(max_length=chars, pattern="^[^\x00]*$")]
            return Annotated[str, msgspec.Meta(max_length=chars)]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.struct_for(tp)
        raise TypeError(f"no msgspec type for {tp!r} ({where})")

    def _lose(self, what: str, where: str) -> None:
        self.lost.setdefault(what, set()).add(where)


def message_classes() -> list[type[Message]]:
    """Every tagged message of the protocol, all its modules imported: what a daemon's decoder must know."""
    for module in pkgutil.iter_modules(tfrun.protocol.__path__):
        importlib.import_module(f"tfrun.protocol.{module.name}")
    found: list[type[Message]] = []
    todo: list[type[Message]] = [Message]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.TYPE and cls not in found:
            found.append(cls)
    return found


def _digest(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _job(i: int) -> Job:
    return Job(
        id=i, state="succeeded", script="train.py", args=["--epochs", "20", "--lr", "0.001"],
        command=["/usr/bin/python3", "train.py", "--epochs", "20", "--lr", "0.001"], workdir=f"/s/jobs/{i}/work",
        job_dir=f"/s/jobs/{i}", log_path=f"/s/jobs/{i}/output.log", checkpoint_dir=f"/s/ckpt/{i}",
        created_at=1.7e9 + i * 61.25, name=f"resnet-{i}", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        started_at=1.7e9 + i * 61.25 + 0.5, finished_at=1.7e9 + i * 61.25 + 3600.125, exit_code=0, pid=4000 + i,
        source="/home/ann/resnet", git_commit="9f" * 20, git_dirty=False, files=120, bytes=88_000,
        restart_on=["lost", "oom", "signal"], alert_rules=["stall=30m", "spike"], gpus_requested=1, gpus=["0"],
    )  # fmt: skip


def samples() -> dict[str, Message]:
    """The representative messages: a submit's, the 100,000-digest upload (runner/daemon.py `_decode`), a long
    listing, a full metrics reply (MAX_METRIC_SAMPLES) and the small request every `logs` sends."""
    files = [FileEntry("data", "dir", mode=0o755)] + [
        FileEntry(f"data/shard-{i:05d}.tfrecord", "file", size=4096 + i, digest=_digest(i)) for i in range(1000)
    ]
    return {
        "Submit: 1,001 files, 200 args, 50 env": Submit(
            files=files, script="train.py", args=[f"--flag-{i}=välue-{i}" for i in range(200)],
            env={f"VAR_{i}": f"value {i}" for i in range(50)}, name="resnet-50", alerts=["stall=30m"],
            metric_patterns=[r"loss=(?P<loss>\S+)"], after=["12", "prep"], git_commit="9f" * 20,
            submission_id="6f1c0d0e-8a52-4a87-9c3b-2f1b8e1f6f0a",
        ),
        "HaveBlobs: 100,000 digests": HaveBlobs([_digest(i) for i in range(100_000)]),
        "PutBlobs: 100,000 digests (header)": PutBlobs([_digest(i) for i in range(100_000)], [10] * 100_000,
                                                       b"x" * 1_000_000),
        "JobList: 1,000 jobs": JobList([_job(i) for i in range(1000)]),
        "MetricsReply: 100,000 samples": MetricsReply(
            "callback",
            [MetricSample(i, {"loss": 2.0 / (i + 1), "accuracy": 1 - 1.0 / (i + 2)}, i // 1000, 1.7e9 + i * 0.05)
             for i in range(100_000)],
        ),
        "ReadLog": ReadLog(job="resnet-50", follow=True, patterns=["loss", "val_.*"], tail=100, timestamps=True),
    }  # fmt: skip


def per_op(work: Callable[[], object], runs: int) -> float:
    """Seconds one call of `work` takes: the median of `runs` samples, each repeating it for SAMPLE_SECONDS.
    The garbage collector stays on, as in the daemon: 100,000 records made set it off today and with msgspec."""
    started = time.perf_counter()
    work()
    number = max(1, math.ceil(SAMPLE_SECONDS / max(time.perf_counter() - started, 1e-7)))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(number):
            work()
        times.append((time.perf_counter() - started) / number)
    return statistics.median(times)


def _today(header: bytes) -> Message:
    """What tfrund does with a header: decode and check it, and make the message (read_rest, less the payload)."""
    cls, kwargs, _ = decode_header(header)
    name = bytes_field(cls)
    return cls(**kwargs, **({name: b""} if name else {}))


def _shown(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def speed_row(what: str, msg: Message, read: Callable[[bytes], Any], write: Callable[[Any], bytes], runs: int) -> str:
    """Decode+check and encode of `msg` today and by `read` and `write`, and whether the frame `write` makes is
    today's, byte for byte or as an old peer reads it."""
    frame = encode(msg)
    header, _, payload = frame.partition(b"\n")
    struct = read(header)
    if msgspec.to_builtins(struct) != json.loads(header):  # json's NaN is one object: equal to itself here
        raise SystemExit(f"msgspec read {what} otherwise than today's decoder")
    theirs = write(struct) + b"\n" + payload
    old_reads = decode_header(theirs.partition(b"\n")[0])[1] == decode_header(header)[1]
    dec = (per_op(lambda: _today(header), runs), per_op(lambda: read(header), runs))
    enc = (per_op(lambda: encode(msg), runs), per_op(lambda: write(struct) + b"\n" + payload, runs))
    return (
        f"| {what} | {len(header) / 1e6:.2f} MB | {_shown(dec[0])} | {_shown(dec[1])} | {dec[1] / dec[0]:.2f}x "
        f"| {_shown(enc[0])} | {_shown(enc[1])} | {enc[1] / enc[0]:.2f}x | {'yes' if theirs == frame else 'no'} "
        f"| {'yes' if old_reads else 'NO'} |"
    )


def _outcome(read: Callable[[], object]) -> str:
    try:
        read()
    except (ProtocolError, msgspec.ValidationError, msgspec.DecodeError, UnicodeEncodeError) as exc:
        return f"`` {exc} ``".replace("|", "\\|")  # a code span that may hold msgspec's own backticks
    return "accepted"


def _struct_of(union: Any, msg: Message) -> Any:
    """`msg` as its Struct, made from Python values, not JSON (which would refuse what is to be shown)."""
    values = {f.name: plain(getattr(msg, f.name)) for f in dataclasses.fields(msg)}  # type: ignore[arg-type]
    return msgspec.convert({**values, "type": msg.TYPE}, union)


def error_rows(union: Any, decoder: Any, encoder: Any) -> list[str]:
    """Each side's one line for a bad field, and what each does with frames today's peers send every day."""
    nan = MetricsReply("callback", [MetricSample(5, {"loss": math.nan})])
    odd = Submit(files=[FileEntry("caf\udce9.py", "file", size=3, digest=_digest(0))], script="caf\udce9.py")
    bad = {
        "negative `tail`": encode(ReadLog(job="7", tail=-1)),
        "a 200-character job": encode(ReadLog(job="x" * 200)),
        "`grace` above its bound": encode(Cancel(jobs=["7"], grace=1e9)),
        "1,001 jobs to cancel (at most 1,000)": encode(Cancel(jobs=["7"] * 1001)),
        "a number where a job belongs": b'{"type":"wait","job":12}',
        "no `digests`": b'{"type":"have_blobs"}',
        "an unknown message": b'{"type":"reboot_box"}',
        "not JSON": b'{"type":"wait",',
        "a NaN loss (today's daemon sends it)": encode(nan),
        "a file name that is not UTF-8 (today's client sends it)": encode(odd),
    }
    rows = []
    for what, frame in bad.items():
        ours, theirs = _outcome(functools.partial(_today, frame)), _outcome(functools.partial(decoder.decode, frame))
        rows.append(f"| {what} | {ours} | {theirs} |")
    return [
        *rows,
        "| that NaN loss, written by msgspec, read by today's peer (an old client) "
        f"| {_outcome(lambda: _today(encoder.encode(_struct_of(union, nan))))} | (msgspec writes `null`) |",
        f"| that file name, written by msgspec | | {_outcome(lambda: encoder.encode(_struct_of(union, odd)))} |",
    ]


START = {
    "`python3 -c pass` (the floor)": "pass",
    "import tfrun.protocol.jobs (what `tfrun ps` loads)": "import tfrun.protocol.jobs",
    "import every tfrun.protocol module (what tfrund loads)": "import tfrun.protocol.admin, tfrun.protocol.files, "
    "tfrun.protocol.housekeeping, tfrun.protocol.jobs, tfrun.protocol.logs, tfrun.protocol.services, "
    "tfrun.protocol.submit, tfrun.protocol.watching",
    "import msgspec": "import msgspec",
    "import tfrun.protocol.jobs, msgspec": "import tfrun.protocol.jobs, msgspec",
}


def start_rows(starts: int) -> list[str]:
    """Fresh interpreters, from compiled bytecode as an installed tfrun starts (bench/cli_start.py's way)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    compileall.compile_dir(REPO / "tfrun" / "protocol", quiet=1)
    times: dict[str, list[float]] = {what: [] for what in START}
    for _ in range(starts):  # interleaved: a machine whose load changes skews each alike
        for what, code in START.items():
            times[what].append(timed([sys.executable, "-c", code], env))
    floor = stats(times[next(iter(START))])[0]
    rows = []
    for what, samples_ in times.items():
        p50, p90 = stats(samples_)
        rows.append(f"| {what} | {p50 * 1e3:.1f} ({p90 * 1e3:.1f}) | +{(p50 - floor) * 1e3:.1f} |")
    return rows


def _unpacked(wheel: Path) -> int:
    with zipfile.ZipFile(wheel) as z:
        return sum(i.file_size for i in z.infolist())


def wheel_rows() -> list[str]:
    """msgspec's wheel for this platform and tfrun's own, built from HEAD in a temporary folder (not the
    checkout, where others build). Needs PyPI: pip downloads the one and tfrun's build backend for the other."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "src"), Path(tmp, "out")
        src.mkdir()
        quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        steps = {
            f"msgspec {msgspec.__version__}": [[*pip, "download", f"msgspec=={msgspec.__version__}", "--no-deps",
                                                "--only-binary=:all:", "-d", str(out / "msgspec")]],
            "tfrun (HEAD)": [["sh", "-c", f"git -C {REPO} archive HEAD | tar -x -C {src}"],
                             [*pip, "wheel", "--no-deps", "-w", str(out / "tfrun"), str(src)]],
        }  # fmt: skip
        for what, commands in steps.items():
            try:
                for command in commands:
                    subprocess.run(command, **quiet)  # type: ignore[call-overload]
            except subprocess.CalledProcessError as exc:
                rows.append(f"| {what} | failed: {exc.stderr.decode()[-200:].strip()} | | |")
                continue
            (wheel,) = (out / what.split()[0]).glob("*.whl")
            rows.append(f"| {what} | `{wheel.name}` | {wheel.stat().st_size / 1e3:.0f} kB "
                        f"| {_unpacked(wheel) / 1e3:.0f} kB |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timing samples a figure is the median of")
    parser.add_argument("--starts", type=int, default=20, help="fresh interpreters a start figure is the p50 of")
    parser.add_argument("--no-wheels", action="store_true", help="skip the wheels (they need PyPI)")
    args = parser.parse_args()
    classes = message_classes()
    translator = Translator()
    started = time.perf_counter()
    structs = tuple(translator.struct_for(cls) for cls in classes)
    made = time.perf_counter() - started
    union: Any = Union.__getitem__(structs)
    started = time.perf_counter()
    decoder = msgspec.json.Decoder(union)
    compiled = time.perf_counter() - started
    encoder = msgspec.json.Encoder()

    print(f"\nmsgspec {msgspec.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"{len(classes)} messages; medians of {args.runs} samples\n")  # fmt: skip
    print("| message | header | decode+check today | msgspec | ratio | encode today | msgspec | ratio "
          "| same bytes | old peer reads it |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    representative = samples()
    for what, msg in representative.items():
        print(speed_row(what, msg, decoder.decode, encoder.encode, args.runs))
    metrics = typing.cast(MetricsReply, representative["MetricsReply: 100,000 samples"])
    metrics.samples[-1].values["loss"] = math.nan  # a loss that diverged: msgspec reads no NaN, writes null
    print(speed_row(
        "the same, its last loss NaN, by json.loads + msgspec.convert and to_builtins + json.dumps", metrics,
        lambda line: msgspec.convert(json.loads(line), union),
        lambda struct: json.dumps(msgspec.to_builtins(struct), separators=(",", ":")).encode("ascii"), args.runs,
    ))  # fmt: skip
    print("\n| bad or unusual frame | today | msgspec |\n| --- | --- | --- |")
    print("\n".join(error_rows(union, decoder, encoder)))
    print("\n| a bound of today's that msgspec cannot hold | fields | among them |\n| --- | --- | --- |")
    for what, where in sorted(translator.lost.items()):
        print(f"| {what} | {len(where)} | {', '.join(sorted(where)[:4])}{', …' if len(where) > 4 else ''} |")
    print(f"\n{args.starts} fresh interpreters each; ms, p50 (p90)\n")
    print("| start | p50 (p90) | over the floor |\n| --- | --- | --- |")
    print("\n".join(start_rows(args.starts)))
    print(f"| in process: {len(structs)} Structs made (defstruct, from the declarations) | {made * 1e3:.1f} | |")
    print(f"| in process: msgspec.json.Decoder of their tagged union | {compiled * 1e3:.1f} | |")
    if not args.no_wheels:
        print("\n| wheel | file | size | unpacked |\n| --- | --- | --- | --- |")
        print("\n".join(wheel_rows()))


if __name__ == "__main__":
    main()
