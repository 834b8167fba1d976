"""TOML as text: the line a key sits on (errors name it), TOML's own errors with their line, and the smallest
edit that sets or removes one key while every comment and every other line stays as the user wrote it.

Shared by the client's config (~/.config/tfrun/config.toml) and the daemon's ($TFRUN_HOME/config.toml).
tomllib reads TOML but keeps no positions and writes nothing; tomli_w writes but drops comments; tomlkit
would do both, as one more dependency for two small jobs that tomllib itself can check: every edit here is
made on lines, and whoever edits loads the result with its own loader before writing it.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Optional, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9 and 3.10
    import tomli as tomllib

KeyPath = tuple[str, ...]  # where a key lives: ("alerts", "cooldown")
# What a file may hold, for `unknown_key`: a name maps to None (a value), to a Schema (a table whose keys
# are known), or to ANY (a table of free names, such as a host's env); the name ANY stands for every name.
ANY = "*"
Schema = dict[str, Union[str, "Schema", None]]

_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_KEY = re.compile(rf"\s*({_DOTTED})\s*=")
_HEADER = re.compile(rf"\s*\[\[?\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_AT_LINE = re.compile(r"^(.*) \(at line (\d+), column \d+\)$", re.DOTALL)
_AT_END = re.compile(r"^(.*) \(at end of document\)$", re.DOTALL)


def decode_error(where: str, exc: Exception, text: str) -> str:
    """tomllib's complaint as `WHERE line N: what`, the way a person looks for it in an editor."""
    message = str(exc)
    found = _AT_LINE.match(message)
    if found:
        return f"{where} line {found[2]}: {found[1]}"
    found = _AT_END.match(message)
    if found:  # something left open runs to the end: the last line is where the reader gave up
        return f"{where} line {max(1, len(text.splitlines()))}: {found[1]}"
    return f"{where}: {message}"


@dataclass(frozen=True)
class _Entry:
    path: KeyPath  # the key's whole path, or a table header's
    start: int  # its first line (0-based)
    end: int  # one past its last line
    header: bool


def _path(dotted: str) -> KeyPath:
    """The parts of a dotted key as TOML reads them (quotes and escapes undone)."""
    node: Any = tomllib.loads(f"{dotted} = 0")
    parts = []
    while isinstance(node, dict):
        (name, node), *_ = node.items()
        parts.append(name)
    return tuple(parts)


def _value_end(lines: list[str], start: int) -> int:
    """One past the last line of the key/value pair that starts at `start`: the first span that TOML reads
    whole (a value may run over lines: arrays, multi-line strings)."""
    for end in range(start + 1, len(lines) + 1):
        try:
            tomllib.loads("".join(lines[start:end]))
        except tomllib.TOMLDecodeError:
            continue
        return end
    return start + 1


def _entries(lines: list[str]) -> list[_Entry]:
    """Every table header and key/value pair of the file, in order, with the lines each takes."""
    table: KeyPath = ()
    out = []
    i = 0
    while i < len(lines):
        header = _HEADER.match(lines[i])
        key = None if header else _KEY.match(lines[i])
        if header:
            table = _path(header[1])
            out.append(_Entry(table, i, i + 1, True))
            i += 1
        elif key:
            end = _value_end(lines, i)
            out.append(_Entry(table + _path(key[1]), i, end, False))
            i = end
        else:
            i += 1
    return out


def line_of(text: str, path: KeyPath) -> Optional[int]:
    """The line (1-based) where `path` is set or its table begins, or where the value that holds it does (an
    inline table); None if the text never names it."""
    for entry in _entries(text.splitlines(keepends=True)):
        inside = not entry.header and path[: len(entry.path)] == entry.path
        if entry.path[: len(path)] == path or inside:
            return entry.start + 1
    return None


def nul_byte(where: str, text: str, raw: dict[str, Any], table: KeyPath = ()) -> Optional[str]:
    """`WHERE line N: job_python cannot hold a NUL byte` for the first string of `raw` (as read from `text`)
    that holds one ("\u0000" in TOML): no path, argument or URL can, and the OS calls given one raise."""
    for key, value in raw.items():
        path = (*table, key)
        if isinstance(value, dict):
            found = nul_byte(where, text, value, path)
            if found:
                return found
        elif any(isinstance(item, str) and "\0" in item for item in (value if isinstance(value, list) else [value])):
            line = line_of(text, path)
            return f"{where}{f' line {line}' if line else ''}: {'.'.join(path)} cannot hold a NUL byte"
    return None


def unknown_key(where: str, text: str, raw: dict[str, Any], schema: Schema) -> Optional[str]:
    """`WHERE line N: unknown key 'x'; did you mean 'y'?` for the first key of `raw` (as read from `text`)
    that `schema` does not know, or None when it knows them all."""
    found = list(_unknown(raw, schema, ()))
    if not found:
        return None
    lines = {path: line_of(text, path) or 0 for path, _ in found}
    path, names = min(found, key=lambda item: lines[item[0]])
    table = f" in [{'.'.join(path[:-1])}]" if len(path) > 1 else ""
    import difflib  # only for a key that is wrong

    hint = difflib.get_close_matches(path[-1], names, n=1)
    home = next((p[:-1] for p in _leaves(schema, ()) if p[-1] == path[-1] and p[:-1] != path[:-1]), None)
    if hint:
        advice = f"; did you mean '{hint[0]}'?"
    elif home:
        advice = f"; it belongs in [{'.'.join('NAME' if p == ANY else p for p in home)}]"
    elif home is not None:
        advice = "; it belongs at the top, before any [table]"
    else:
        advice = ""
    at = f" line {lines[path]}" if lines[path] else ""
    return f"{where}{at}: unknown key '{path[-1]}'{table}{advice}"


def _unknown(raw: dict[str, Any], schema: Schema, path: KeyPath) -> list[tuple[KeyPath, list[str]]]:
    """(path, the names its table knows) of every key of `raw` that `schema` does not know."""
    found: list[tuple[KeyPath, list[str]]] = []
    for name, value in raw.items():
        if name in schema:
            sub = schema[name]
        elif ANY in schema:
            sub = schema[ANY]
        else:
            found.append(((*path, name), [n for n in schema if n != ANY]))
            continue
        if isinstance(sub, dict) and isinstance(value, dict):
            found.extend(_unknown(value, sub, (*path, name)))
    return found


def _leaves(schema: Schema, path: KeyPath) -> list[KeyPath]:
    """Every named value the schema knows, by path."""
    out = []
    for name, sub in schema.items():
        if isinstance(sub, dict):
            out.extend(_leaves(sub, (*path, name)))
        elif name != ANY:
            out.append((*path, name))
    return out


def render(value: Union[str, int, list[Any]]) -> str:
    """A value as TOML writes it inline: JSON's strings, numbers and arrays are valid TOML."""
    return json.dumps(value, ensure_ascii=False)


def set_key(text: str, path: KeyPath, rendered: str) -> str:
    """`text` with `path` set to the TOML value `rendered`: its own lines replaced if it is there (its
    trailing comment kept), else one line added to its table (the table added at the end if missing)."""
    lines = _lines(text)
    entries = _entries(lines)
    key = _bare(path[-1])
    found = next((e for e in entries if not e.header and e.path == path), None)
    if found is not None:
        first = lines[found.start]
        name = first[: _KEY.match(first).end(1)]  # type: ignore[union-attr]  # as written, indent and all
        lines[found.start : found.end] = [f"{name} = {rendered}{_comment(lines[found.start : found.end])}\n"]
        return "".join(lines)
    table = path[:-1]
    if not table:
        headers = [e.start for e in entries if e.header]
        section_end = headers[0] if headers else len(lines)
        at = max((e.end for e in entries if not e.header and e.end <= section_end), default=None)
        if at is None:
            at = section_end
            lines.insert(at, "\n" if headers else "")
        lines.insert(at, f"{key} = {rendered}\n")
        return "".join(lines)
    header = next((e for e in entries if e.header and e.path == table), None)
    if header is None:
        gap = "\n" if lines and lines[-1].strip() else ""
        return "".join(lines) + f"{gap}[{'.'.join(map(_bare, table))}]\n{key} = {rendered}\n"
    later = [e.start for e in entries if e.header and e.start > header.start]
    section_end = later[0] if later else len(lines)
    at = max((e.end for e in entries if not e.header and header.start < e.start < section_end), default=header.end)
    lines.insert(at, f"{key} = {rendered}\n")
    return "".join(lines)


def remove_key(text: str, path: KeyPath) -> Optional[str]:
    """`text` without the lines that set `path`; None if it does not set it."""
    lines = _lines(text)
    found = next((e for e in _entries(lines) if not e.header and e.path == path), None)
    if found is None:
        return None
    del lines[found.start : found.end]
    return "".join(lines)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def _bare(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _comment(span: list[str]) -> str:
    """The comment after a key/value pair's value (with the space before it), or ""."""
    head, last = "".join(span[:-1]), span[-1].rstrip("\n")
    for mark in re.finditer("#", last):
        value = last[: mark.start()]
        try:
            tomllib.loads(head + value)
        except tomllib.TOMLDecodeError:
            continue  # a '#' inside a string
        return last[len(value.rstrip()) :]
    return ""
