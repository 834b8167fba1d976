"""Field types and their checks: the bounds a field's values must keep, declared with the field
(`typing.Annotated`), and the code that converts a peer's JSON into checked constructor arguments.

A checker is built once per type and cached, since a manifest of thousands of entries goes through the
same few checks thousands of times. Job states and error codes live here too: every module below uses them."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, Optional, Union

from tfrun.constants import (
    MAX_CONTEXT,
    MAX_ENV,
    MAX_INT64,
    MAX_LIST_ITEMS,
    MAX_NAME,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_STRING,
)
from tfrun.numerals import is_digits

State = Literal["queued", "running", "succeeded", "failed", "cancelled", "lost"]  # a job's, as the wire spells it


class JobState:
    """The states a job moves through (`State`). The last four are final: the job's processes are all gone."""

    QUEUED: Final[State] = "queued"  # recorded, its shim not yet running
    RUNNING: Final[State] = "running"
    SUCCEEDED: Final[State] = "succeeded"  # exited 0
    FAILED: Final[State] = "failed"  # exited non-zero, was killed by a signal, or could not start
    CANCELLED: Final[State] = "cancelled"  # ended after `tfrun cancel`
    LOST: Final[State] = "lost"  # its shim vanished without recording an exit status (e.g. the machine rebooted)

    ALL: tuple[str, ...] = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST)
    FINAL: tuple[str, ...] = (SUCCEEDED, FAILED, CANCELLED, LOST)


# Why a failed or lost job ended, as `submit --restart-on` names the causes (tfrun/restarts.py says each):
# its shim, daemon or machine went (lost), it ran out of memory, a signal killed it, it exited non-zero.
Cause = Literal["lost", "oom", "signal", "error"]
CAUSES: tuple[Cause, ...] = ("lost", "oom", "signal", "error")


class ErrorCode:
    """Machine-readable reasons in `Error.code`; the message says the same to a person."""

    VERSION_MISMATCH = "version_mismatch"
    BAD_REQUEST = "bad_request"
    NO_SUCH_JOB = "no_such_job"
    INVALID_INPUT = "invalid_input"  # well-formed, but cannot be done (missing script, unreadable folder)
    INTERNAL = "internal"
    NO_ROOM = "no_room"  # the box had no room for it: its disk full, or tfrund's file descriptors used up
    CANNOT_START = "cannot_start"  # no daemon runs and none could start: `tfrund dial-stdio` answers for it


@dataclass(frozen=True)
class Range:
    """The inclusive bounds of a number: ints for an int field (a float would round 2^63-1 when shown)."""

    low: Union[int, float]
    high: Union[int, float]


@dataclass(frozen=True)
class Limit:
    """At most `items` entries in a list; at most `chars` characters in a string, or in a list's strings
    together (what a request may make the daemon compile or hold)."""

    items: int = MAX_LIST_ITEMS
    chars: Optional[int] = None  # a string: MAX_STRING; a list: no bound of its own


class _Marker:
    """A property of a field's values beyond its bounds; named, so that a field's declaration reads well."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# A plain `str` may hold surrogate escapes (U+DC80 to U+DCFF, as os.fsdecode makes them), so that file names
# and arguments that are not UTF-8 cross intact; no other surrogate, as it stands for no byte.
# A `Text` holds none: it is bound to SQLite, compiled by RE2, or compared with names that are UTF-8.
UTF8 = _Marker("UTF8")


NON_FINITE = _Marker("NON_FINITE")  # a float that may be NaN or infinite (a loss that diverged); others may not


# A string the operating system is given, a path or an argument: no NUL byte, which none of them can hold
# (Python's os functions raise ValueError on one, which is no answer for the peer).
NO_NUL = _Marker("NO_NUL")


Text = Annotated[str, UTF8]


JobRef = Annotated[str, UTF8, Limit(chars=MAX_NAME)]  # an id (ASCII digits) or a name; see is_job_id


Offset = Annotated[int, Range(0, MAX_INT64)]  # a byte offset or size, a count


Mode = Annotated[int, Range(0, 0o7777)]


OsText = Annotated[str, NO_NUL]  # a path or a program's argument; it may be any bytes but NUL (surrogate escapes)


Reading = Annotated[float, NON_FINITE]


Patterns = Annotated[list[Text], Limit(items=MAX_PATTERNS, chars=MAX_PATTERN_CHARS)]


Context = Annotated[int, Range(0, MAX_CONTEXT)]


def is_job_id(ref: str) -> bool:
    """Whether `ref` is written as a job id: ASCII digits only ("²" and "١٢" are names, as int() would not
    read them as the user meant)."""
    return is_digits(ref)


class BadValue(Exception):
    """A value that does not fit its declared type; `where` grows as the error travels out of the value."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.where = ""


Checker = typing.Callable[[Any], Any]


_CHECKERS: dict[Any, Checker] = {}


_PLANS: dict[type[Any], tuple[list[tuple[str, Checker, bool]], Optional[str]]] = {}


def _checker(tp: Any) -> Checker:
    """A function that returns a value converted to `tp` or raises BadValue: built once per type, since
    a manifest of thousands of entries goes through the same few checks thousands of times."""
    found = _CHECKERS.get(tp)
    if found is None:
        found = _CHECKERS[tp] = _make_checker(tp)
    return found


def _make_checker(tp: Any) -> Checker:
    extras: tuple[Any, ...] = ()
    if typing.get_origin(tp) is Annotated:
        tp, *rest = typing.get_args(tp)
        extras = tuple(rest)
    bounds = next((e for e in extras if isinstance(e, Range)), None)
    limit = next((e for e in extras if isinstance(e, Limit)), Limit())
    origin = typing.get_origin(tp)
    if origin is Union:
        inner = _checker(next(o for o in typing.get_args(tp) if o is not type(None)))
        return lambda value: None if value is None else inner(value)
    if origin is Literal:  # a job's state: one of a few words
        allowed = typing.get_args(tp)
        shown = ", ".join(map(str, allowed))
        return lambda value: value if value in allowed else fail(f"expected one of {shown}")
    if origin is list:
        return _list_checker(_checker(typing.get_args(tp)[0]), limit)
    if origin is dict:
        return _dict_checker(_checker(typing.get_args(tp)[1]))
    if tp is bool:
        return lambda value: value if isinstance(value, bool) else fail("expected true or false")
    if tp is int:
        return _int_checker(bounds or Range(-MAX_INT64 - 1, MAX_INT64))
    if tp is float:
        return _float_checker(bounds, finite=NON_FINITE not in extras)
    if tp is str:
        return _str_checker(MAX_STRING if limit.chars is None else limit.chars, UTF8 in extras, NO_NUL in extras)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        cls = tp

        def check_record(value: Any) -> Any:
            if not isinstance(value, dict):
                fail("expected an object")
            return cls(**checked_kwargs(cls, value))

        return check_record
    raise TypeError(f"unsupported field type {tp!r}")  # a mistake in this file, not in the peer


def fail(message: str) -> Any:
    raise BadValue(message)


def _int_checker(bounds: Range) -> Checker:
    def check_int(value: Any) -> int:
        if type(value) is not int:
            fail("expected an integer")
        if not bounds.low <= value <= bounds.high:
            fail(f"out of range (from {bounds.low} to {bounds.high})")
        return typing.cast(int, value)

    return check_int


def _float_checker(bounds: Optional[Range], finite: bool) -> Checker:
    def check_float(value: Any) -> float:
        if type(value) not in (int, float):
            fail("expected a number")
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            fail("out of range")
        if finite and not math.isfinite(number):
            fail("expected a finite number")
        if bounds is not None and not bounds.low <= number <= bounds.high:
            fail(f"out of range (from {bounds.low:g} to {bounds.high:g})")
        return number

    return check_float


def _str_checker(chars: int, utf8: bool, no_nul: bool = False) -> Checker:
    def check_str(value: Any) -> str:
        if type(value) is not str:
            fail("expected a string")
        if len(value) > chars:
            fail(f"longer than {chars} characters")
        if no_nul and "\0" in value:
            fail("holds a NUL byte, which no path or argument can")
        if not value.isascii():
            try:
                value.encode("utf-8", "strict" if utf8 else "surrogateescape")
            except UnicodeEncodeError:
                fail("not UTF-8 text" if utf8 else "a surrogate that stands for no byte")
        return typing.cast(str, value)

    return check_str


_check_str = _str_checker(MAX_STRING, utf8=False)


def _list_checker(item: Checker, limit: Limit) -> Checker:
    def check_list(value: Any) -> list[Any]:
        if not isinstance(value, list):
            fail("expected a list")
        if len(value) > limit.items:
            fail(f"more than {limit.items} items")
        out = []
        for i, element in enumerate(value):
            try:
                out.append(item(element))
            except BadValue as exc:
                exc.where = f"[{i}]{exc.where}"
                raise
        if limit.chars is not None and sum(len(e) for e in out) > limit.chars:
            fail(f"more than {limit.chars} characters together")
        return out

    return check_list


def _dict_checker(item: Checker) -> Checker:
    def check_dict(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            fail("expected an object")
        if len(value) > MAX_ENV:
            fail(f"more than {MAX_ENV} entries")
        out = {}
        for key, element in value.items():
            try:
                out[_check_str(key)] = item(element)
            except BadValue as exc:
                exc.where = f".{key}{exc.where}"
                raise
        return out

    return check_dict


def _plan(cls: type[Any]) -> tuple[list[tuple[str, Checker, bool]], Optional[str]]:
    """(name, checker, required) for each field of `cls` but its raw-bytes one, and that one's name."""
    found = _PLANS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = [
            (
                f.name,
                _checker(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if hints[f.name] is not bytes
        ]
        raw_bytes = next((name for name, tp in hints.items() if tp is bytes), None)
        found = _PLANS[cls] = (fields, raw_bytes)
    return found


def checked_kwargs(cls: type[Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The checked constructor arguments of `cls` found in `raw`, less any raw-bytes field.

    Unknown keys are ignored, so that a peer may add optional fields without bumping the protocol.
    """
    kwargs: dict[str, Any] = {}
    for name, check, required in _plan(cls)[0]:
        if name in raw:
            try:
                kwargs[name] = check(raw[name])
            except BadValue as exc:
                exc.where = f".{name}{exc.where}"
                raise
        elif required:
            fail(f"missing field {name!r}")
    return kwargs


def bytes_field(cls: type[Any]) -> Optional[str]:
    """The name of the class's raw-bytes field, if it has one."""
    return _plan(cls)[1]


def validate_name(name: str) -> Optional[str]:
    """Why `name` cannot name a job, or None. Names must never be mistaken for ids."""
    if not name or len(name) > MAX_NAME:
        return f"a job name has 1 to {MAX_NAME} characters"
    if is_job_id(name):
        return "a job name cannot be all digits (it would read as a job id)"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "a job name cannot contain spaces or control characters"
    return None
