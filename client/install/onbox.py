"""The steps of `tfrun hosts install` that run on the box, over the SSH connection tfrun already makes:
find a Python there, ask it about the box, copy the wheels over, make the venv, pip install, start tfrund.

Each step is one command on the box, run by its /bin/sh or by the Python found there (no scp or sftp needed:
one exec channel carries a tar stream of the wheels), and each failure is a one-line `TfrunError` that says
what to do. The wheels come from client/install/wheel.py; client/install/steps.py puts the steps in order.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from tfrun.constants import BOX_PYTHONS, EXIT_DAEMON, EXIT_FAILURE, MIN_BOX_PYTHON
from tfrun.numerals import is_digits

from ..config.settings import Host
from ..errors import TfrunError

if TYPE_CHECKING:
    import asyncssh
_MARKER = "tfrun-install.json"  # in the venv: the version and content digest of what was installed there

# Run by the box's shell through /bin/sh: every Python the box has under the names tfrund accepts, with its
# version, and the PATH they were looked for in (for the message when none will do).
_FIND_PYTHONS = (
    'echo "PATH $PATH"; for name in {names}; do path=$(command -v "$name") || continue; '
    'version=$("$path" -c \'import sys; print("%d.%d.%d" % sys.version_info[:3])\' 2>/dev/null) || version=?; '
    'printf \'PYTHON\\t%s\\t%s\\t%s\\n\' "$name" "$path" "$version"; done'
)

# Run by the chosen Python on the box: what it needs to know to install there, as one JSON line.
_BOX_INFO = """
import glob, json, os, platform, sys
venv = os.path.abspath(os.path.expanduser(sys.argv[1]))
installed = []
for path in glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "tfrun-*.dist-info", "METADATA")):
    with open(path, encoding="utf-8", errors="replace") as f:
        installed += [line.split(":", 1)[1].strip() for line in f if line.startswith("Version:")][:1]
try:
    with open(os.path.join(venv, "tfrun-install.json")) as f:
        marker = json.load(f)
except (OSError, ValueError):
    marker = {}
ours = os.path.exists(os.path.join(venv, "pyvenv.cfg")) and (
    bool(installed) or os.path.exists(os.path.join(venv, "tfrun-install.json")))
try:
    other = not ours and bool(os.listdir(venv))
except NotADirectoryError:
    other = True
except OSError:
    other = False
libc, libc_version = platform.libc_ver()
print(json.dumps({"venv": venv, "installed": installed, "marker": marker, "system": platform.system(),
    "has_venv": os.path.exists(os.path.join(venv, "bin", "python")), "other_folder": other,
    "machine": platform.machine(), "libc": libc, "libc_version": libc_version,
    "implementation": sys.implementation.name, "python": list(sys.version_info[:2])}))
"""

# Run by the box's Python, reading a tar stream on stdin: unpacks it into a new folder and prints its path.
_UNPACK = """
import shutil, sys, tarfile, tempfile
folder = tempfile.mkdtemp(prefix="tfrun-install-")
try:
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
        archive.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
except BaseException:
    shutil.rmtree(folder)
    raise
print(folder)
"""


@dataclasses.dataclass(frozen=True)
class BoxPython:
    """An interpreter on the box, by its path there, and its version (`3.11.4`, or `?`)."""

    path: str
    version: str


def _tar(files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in files:
            archive.add(path, arcname=path.name)
    return buffer.getvalue()


async def _run(conn: asyncssh.SSHClientConnection, command: str, stdin: Optional[bytes] = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a command on the box."""
    if stdin is None:
        result = await conn.run(command, check=False)
        return int(result.exit_status or 0), _text(result.stdout), _text(result.stderr)
    result = await conn.run(command, check=False, input=stdin, encoding=None)
    return int(result.exit_status or 0), _text(result.stdout), _text(result.stderr)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value if isinstance(value, str) else ""


def _last_error(stderr: str) -> str:
    """The line of a failed command's stderr that says what went wrong: pip's `ERROR:` line, else the first."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no message"])[0].removeprefix("ERROR: ")


def _sh(script: str) -> str:
    """`script` for /bin/sh, whatever the login shell: the one shell every box has at that path."""
    return f"/bin/sh -c {shlex.quote(script)}"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if is_digits(part))


async def find_python(conn: asyncssh.SSHClientConnection, host: Host, wanted: Optional[str]) -> BoxPython:
    """The box's Python to make the venv with: `wanted`, else python3, else the newest python3.X, 3.9 at
    least; if none will do, an error that names what the box has."""
    names = [wanted] if wanted else list(BOX_PYTHONS)
    _, out, _ = await _run(conn, _sh(_FIND_PYTHONS.format(names=" ".join(shlex.quote(n) for n in names))))
    path_line = next((line[5:] for line in out.splitlines() if line.startswith("PATH ")), "?")
    found: list[BoxPython] = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0] == "PYTHON" and parts[2] not in {p.path for p in found}:
            found.append(BoxPython(parts[2], parts[3]))
    for python in found:
        if version_tuple(python.version)[:2] >= MIN_BOX_PYTHON:
            return python
    minimum = ".".join(map(str, MIN_BOX_PYTHON))
    looked_for = wanted or f"{BOX_PYTHONS[0]} or {BOX_PYTHONS[-1]} to {BOX_PYTHONS[1]}"
    seen = ", ".join(f"{p.path} ({p.version})" for p in found) or f"no {looked_for} on its PATH ({path_line})"
    raise TfrunError(
        f"no Python {minimum} or newer on {host.label} to run tfrund: found {seen}; install one there (e.g. "
        f"apt install python3 python3-venv) or name it with `tfrun hosts install {host.name or 'NAME'} --python "
        "PATH`",
        EXIT_FAILURE,
    )


async def box_info(conn: asyncssh.SSHClientConnection, python: BoxPython, venv: str) -> dict[str, Any]:
    status, out, err = await _run(conn, shlex.join([python.path, "-c", _BOX_INFO, venv]))
    try:
        info: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TfrunError(f"{python.path} on the box failed (exit {status}): {_last_error(err)}", EXIT_FAILURE) from None
    return info


async def send(conn: asyncssh.SSHClientConnection, python: BoxPython, files: list[Path]) -> str:
    """Copy `files` into a new folder on the box, through an exec channel (sftp may be off); its path."""
    status, out, err = await _run(conn, shlex.join([python.path, "-c", _UNPACK]), stdin=_tar(files))
    if status != 0 or not out.strip():
        raise TfrunError(f"copying the wheels to the box failed: {_last_error(err)}", EXIT_FAILURE)
    return out.strip().splitlines()[-1]


def refuse_other_folder(info: dict[str, Any], host: Host) -> None:
    """Refuse a `--venv` folder that holds files and is not a tfrun install: making the venv clears it
    (`venv --clear`), and ~/data would lose its files. Empty or missing is fine; a tfrun install is a venv
    (pyvenv.cfg) with tfrun in it, or with the marker that `make_venv` leaves before tfrun is installed."""
    if info.get("other_folder"):
        raise TfrunError(
            f"{info['venv']} on {host.name or 'the box'} has files in it and is not a tfrun install: installing "
            "there would delete them; name an empty or new folder with --venv",
            EXIT_FAILURE,
        )


async def make_venv(conn: asyncssh.SSHClientConnection, python: BoxPython, venv: str) -> None:
    """The venv at `venv` on the box, made (or made again, if it lost its pip) with `python`; marked as
    tfrun's at once, so that an install that fails after this may be tried again there."""
    pip_works = f"{shlex.quote(venv)}/bin/python -m pip --version >/dev/null 2>&1"
    make = f"{shlex.join([python.path, '-m', 'venv', '--clear', venv])} && : >> {shlex.quote(f'{venv}/{_MARKER}')}"
    status, _, err = await _run(conn, _sh(f"{pip_works} || {{ {make}; }}"))
    if status != 0:
        raise TfrunError(
            f"making a venv at {venv} with {python.path} failed: {_last_error(err)} (on Debian and Ubuntu: apt "
            f"install python{'.'.join(python.version.split('.')[:2])}-venv)",
            EXIT_FAILURE,
        )


async def pip_install(
    conn: asyncssh.SSHClientConnection, venv: str, folder: str, wheel: str, offline: bool, marker: dict[str, str]
) -> None:
    """Install the wheel in `folder` into the venv (its dependencies from `folder` when offline, else from the
    box's index), then once more without dependencies: a rebuilt wheel of the same version replaces the old
    one, which pip alone would call already satisfied. The marker says what is installed; `folder` goes."""
    pip = [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    source = ["--no-index", f"--find-links={folder}"] if offline else []
    path = f"{folder}/{wheel}"
    script = (
        f"trap {shlex.quote(shlex.join(['rm', '-rf', folder]))} EXIT; set -e; "
        f"{shlex.join([*pip, *source, path])}; {shlex.join([*pip, '--no-deps', '--force-reinstall', path])}; "
        f"printf '%s\\n' {shlex.quote(json.dumps(marker))} > {shlex.quote(f'{venv}/{_MARKER}')}"
    )
    status, _, err = await _run(conn, _sh(script))
    if status != 0:
        raise TfrunError(f"installing tfrun into {venv} on the box failed: {_last_error(err)}", EXIT_FAILURE)


async def start_daemon(conn: asyncssh.SSHClientConnection, host: Host, restart: bool) -> Optional[int]:
    """Start the installed tfrund (stopping an older one first: its jobs keep running, the new one re-adopts
    them); the pid it says it runs as."""
    from ..link.remotecommand import remote_command

    stop, start = remote_command(host, "stop"), remote_command(host, "start")  # the host's env on stdin
    if restart:
        await _run(conn, stop.line, stop.stdin)
    status, out, err = await _run(conn, start.line, start.stdin)
    if status != 0:
        raise TfrunError(f"tfrund on {host.label} did not start: {_last_error(err)}", EXIT_DAEMON)
    match = re.search(r"pid (\d+)", out)
    return int(match[1]) if match else None
