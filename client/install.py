"""`tfrun hosts install`: put this client's own tfrun on a box, with nothing but the SSH login.

No tfrun package is published, so the box gets exactly what the client runs, the way VS Code's Remote-SSH
installs its server: a wheel built here from the installed tfrun, copied over the SSH connection tfrun
already makes (no scp or sftp needed: one exec channel carries a tar stream), installed into a venv of its
own on the box (so its dependencies never touch the job interpreter), then tfrund started from it and its
path recorded for the host. Dependencies come from the box's package index, or with --offline from wheels
resolved here for the box's Python and platform and sent along.

The wheel is built by hand rather than by pip and setuptools: it is a zip of the installed package and its
metadata, so it needs no network, no build backend in the client's venv (Python 3.12's venvs have none)
and no source checkout, and the same files always make the same bytes, which names the cached wheel.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import tfrun
from tfrun.client import config
from tfrun.client.config import Host
from tfrun.client.errors import TfrunError
from tfrun.constants import BOX_PYTHONS, DEFAULT_BOX_VENV, EXIT_DAEMON, EXIT_FAILURE, EXIT_USAGE, MIN_BOX_PYTHON

if TYPE_CHECKING:
    import asyncssh

Progress = Callable[[str], None]

_MARKER = "tfrun-install.json"  # in the venv: the version and content digest of what was installed there
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every entry's time, so the same files make the same wheel

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
libc, libc_version = platform.libc_ver()
print(json.dumps({"venv": venv, "installed": installed, "marker": marker, "system": platform.system(),
    "has_venv": os.path.exists(os.path.join(venv, "bin", "python")),
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
class Options:
    """What `hosts install` (and `hosts add --install`) was asked for."""

    venv: str = DEFAULT_BOX_VENV  # on the box; ~ is the box's home
    python: Optional[str] = None  # the box's interpreter to make the venv with; default: the newest found
    offline: bool = False  # dependencies from wheels sent from here, not from the box's index
    wheels: Optional[Path] = None  # a local folder of wheels to take them from (implies offline)
    force: bool = False  # install even when the box has this version already


@dataclasses.dataclass
class Result:
    """What happened, for the summary line and --json."""

    host: str
    action: str  # installed, upgraded, downgraded, reinstalled (--force) or unchanged
    version: str
    previous: Optional[str]
    tfrund: str
    python: str  # the box's interpreter the venv was made with
    python_version: str
    offline: bool
    daemon_pid: Optional[int]
    other_files: bool  # unchanged, but the box's copy of this version was built from other files than ours

    def summary(self) -> str:
        where = f"on {self.host}: {self.tfrund}"
        running = f" (running, pid {self.daemon_pid})" if self.daemon_pid else ""
        if self.action == "unchanged":
            other = "; built from other files than this client's: --force replaces it" if self.other_files else ""
            return f"tfrund {self.version} already installed {where}{running}{other}"
        if self.action in ("upgraded", "downgraded"):
            return f"{self.action} tfrund {self.previous} to {self.version} {where}{running}"
        return f"{self.action} tfrund {self.version} {where}{running}"


@dataclasses.dataclass(frozen=True)
class BoxPython:
    path: str
    version: str


# -- the wheel, built here ------------------------------------------------------------------------------------


def _package_files() -> list[tuple[str, Path]]:
    """(name in the wheel, file here) of every file of the installed tfrun package, its symlinked folders
    (tfrun/client -> client/ in a source tree) followed, caches and hidden files (an editor's) left out."""
    root = Path(tfrun.__file__).parent
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                path = Path(folder, name)
                found.append((f"tfrun/{path.relative_to(root).as_posix()}", path))
    return found


def _dist_info(version: str) -> dict[str, bytes]:
    """The wheel's .dist-info files from the installed distribution's metadata (an editable install's
    metadata is the real one), with the version this client reports."""
    try:
        dist = importlib.metadata.distribution("tfrun")
    except importlib.metadata.PackageNotFoundError:
        raise TfrunError("tfrun's metadata is not installed here: install tfrun with pip first", EXIT_FAILURE) from None
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""  # PKG-INFO: an egg-info in a source tree
    if not re.search(r"(?m)^Version: ", metadata):
        raise TfrunError(f"tfrun's installed metadata ({dist.locate_file('')}) has no version", EXIT_FAILURE)
    metadata = re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata, count=1)
    wheel = f"Wheel-Version: 1.0\nGenerator: tfrun {version}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    info = f"tfrun-{version}.dist-info"
    return {
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": wheel.encode(),
        f"{info}/entry_points.txt": (dist.read_text("entry_points.txt") or "").encode(),
        f"{info}/top_level.txt": b"tfrun\n",
    }


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_contents(version: str) -> dict[str, bytes]:
    """Every file of the wheel but RECORD, by its name in the wheel."""
    contents = {name: path.read_bytes() for name, path in _package_files()}
    contents.update(_dist_info(version))
    return contents


def content_digest(contents: dict[str, bytes]) -> str:
    """What names one build: the same files and metadata give the same digest."""
    digest = hashlib.sha256()
    for name in sorted(contents):
        digest.update(f"{name}\0{len(contents[name])}\0".encode())
        digest.update(contents[name])
    return digest.hexdigest()


def build_wheel(version: str) -> tuple[Path, str]:
    """The client's own tfrun as a wheel (cached under the client's cache dir by version and content), and
    the digest of its contents."""
    contents = wheel_contents(version)
    digest = content_digest(contents)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfrun" / "wheels"
    path = base / f"{version}-{digest[:16]}" / f"tfrun-{version}-py3-none-any.whl"
    if path.exists():
        return path, digest
    path.parent.mkdir(parents=True, exist_ok=True)
    record = f"tfrun-{version}.dist-info/RECORD"
    lines = [_record_line(name, data) for name, data in sorted(contents.items())] + [f"{record},,"]
    contents[record] = ("\n".join(lines) + "\n").encode()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():  # RECORD last, as the wheel spec recommends
            entry = zipfile.ZipInfo(name, _ZIP_TIME)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    os.replace(tmp, path)
    return path, digest


# -- dependencies for the box, resolved here (--offline) -------------------------------------------------------


def pip_target(info: dict[str, Any]) -> list[str]:
    """pip download's options that select wheels the box's Python can install: its version, CPython's ABIs
    and the manylinux (or musllinux) platforms its C library accepts."""
    if info["system"] != "Linux" or info["implementation"] != "cpython":
        raise TfrunError(
            f"--offline needs CPython on Linux on the box; it has {info['implementation']} on {info['system']}",
            EXIT_FAILURE,
        )
    major, minor = info["python"]
    arch = info["machine"]
    if info["libc"] == "glibc" and re.fullmatch(r"2\.\d+", info["libc_version"] or ""):
        glibc = int(info["libc_version"].split(".")[1])
        platforms = [f"manylinux_2_{m}_{arch}" for m in range(5, glibc + 1)]
        legacy = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}
        platforms += [f"{name}_{arch}" for m, name in legacy.items() if m <= glibc]
    else:
        platforms = [f"musllinux_1_{m}_{arch}" for m in range(3)]
    abis = [f"cp{major}{minor}", "abi3", "none"]
    return [
        "--only-binary=:all:",
        "--python-version",
        f"{major}.{minor}",
        "--implementation",
        "cp",
        *(f"--abi={abi}" for abi in abis),
        *(f"--platform={platform}" for platform in platforms),
    ]


def download_dependencies(wheel: Path, info: dict[str, Any], wheels: Optional[Path], dest: Path) -> list[Path]:
    """The tfrun wheel and every wheel it needs on the box, in `dest`: from PyPI (or pip's configured index),
    or from the local folder `wheels` without any network."""
    source = ["--no-index", f"--find-links={wheels}"] if wheels else []
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += [*source, *pip_target(info), "--dest", str(dest), str(wheel)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")] or result.stderr.splitlines()
        reason = lines[0].removeprefix("ERROR: ") if lines else f"exit code {result.returncode}"
        where = f"in {wheels}" if wheels else "from the package index"
        raise TfrunError(f"cannot get the wheels the box needs {where}: {reason}", EXIT_FAILURE)
    return sorted(dest.glob("*.whl"))


def _tar(files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in files:
            archive.add(path, arcname=path.name)
    return buffer.getvalue()


# -- the box ------------------------------------------------------------------------------------------------------


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


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


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
        if _version_tuple(python.version)[:2] >= MIN_BOX_PYTHON:
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


async def make_venv(conn: asyncssh.SSHClientConnection, python: BoxPython, venv: str) -> None:
    """The venv at `venv` on the box, made (or made again, if it lost its pip) with `python`."""
    pip_works = f"{shlex.quote(venv)}/bin/python -m pip --version >/dev/null 2>&1"
    status, _, err = await _run(conn, _sh(f"{pip_works} || {shlex.join([python.path, '-m', 'venv', '--clear', venv])}"))
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
    from tfrun.client.ssh import _remote_command as remote_command

    if restart:
        await _run(conn, remote_command(host, "stop"))
    status, out, err = await _run(conn, remote_command(host, "start"))
    if status != 0:
        raise TfrunError(f"tfrund on {host.label} did not start: {_last_error(err)}", EXIT_DAEMON)
    match = re.search(r"pid (\d+)", out)
    return int(match[1]) if match else None


# -- the whole install ------------------------------------------------------------------------------------------


def configured_host(name: Optional[str]) -> Host:
    """The configured host to install on (the default host without a name), or a one-line error."""
    cfg = config.load()
    name = name or cfg.default_host
    if not name or name == config.LOCAL:
        raise TfrunError("no host given and no default host configured", EXIT_USAGE)
    if name not in cfg.hosts:
        raise TfrunError(
            f"no host {name!r} (see tfrun hosts list); add it with: tfrun hosts add {name} user@host --install",
            EXIT_USAGE,
        )
    return cfg.hosts[name]


def record(name: str, tfrund: str) -> None:
    """Remember where the host's tfrund is, re-reading the config so nothing written meanwhile is lost."""
    cfg = config.load()
    if name in cfg.hosts:
        cfg.hosts[name].tfrund = tfrund
        cfg.save()


async def install(name: Optional[str], options: Options, accept_new: bool, progress: Progress) -> Result:
    """Install this client's tfrun on the box of host `name` (see the module docstring); idempotent."""
    from tfrun.client import ssh

    host = configured_host(name)
    assert host.name is not None
    version = tfrun.__version__
    offline = options.offline or options.wheels is not None
    conn = await ssh.open_ssh(host, accept_new)
    try:
        python = await find_python(conn, host, options.python)
        info = await box_info(conn, python, options.venv)
        venv = info["venv"]
        wheel, digest = await asyncio.to_thread(build_wheel, version)
        installed = info["installed"][0] if info["installed"] else None
        marker = info["marker"] if isinstance(info["marker"], dict) else {}
        done = installed == version and not options.force
        tfrund = f"{venv}/bin/tfrund"
        target = dataclasses.replace(host, tfrund=tfrund)
        if not done:
            await _put(conn, python, info, wheel, digest, version, options, offline, progress)
        pid = await start_daemon(conn, target, restart=not done and installed is not None)
    finally:
        conn.close()
    record(host.name, tfrund)
    other_files = done and marker.get("digest") != digest
    return Result(host.name, _action(installed, version, done), version, installed, tfrund, python.path,
                  python.version, offline, pid, other_files)  # fmt: skip


def _action(installed: Optional[str], version: str, done: bool) -> str:
    if done:
        return "unchanged"
    if installed is None:
        return "installed"
    if installed == version:
        return "reinstalled"  # --force
    return "upgraded" if _version_tuple(installed) < _version_tuple(version) else "downgraded"


async def _put(
    conn: asyncssh.SSHClientConnection,
    python: BoxPython,
    info: dict[str, Any],
    wheel: Path,
    digest: str,
    version: str,
    options: Options,
    offline: bool,
    progress: Progress,
) -> None:
    """The long part: the wheels resolved (here, before anything changes on the box), the venv made, the
    wheels copied, tfrun installed."""
    venv = info["venv"]
    with tempfile.TemporaryDirectory(prefix="tfrun-wheels-") as staging:
        files = [wheel]
        if offline:
            python_version = ".".join(map(str, info["python"]))
            progress(f"fetching the wheels tfrun needs for Python {python_version} on the box from "
                     f"{options.wheels or 'the package index'}")  # fmt: skip
            files = await asyncio.to_thread(download_dependencies, wheel, info, options.wheels, Path(staging))
        if not info["has_venv"]:
            progress(f"making the venv {venv} with {python.path} (Python {python.version})")
        await make_venv(conn, python, venv)
        size = sum(path.stat().st_size for path in files)
        progress(f"copying {len(files)} wheel(s), {size / 1e6:.1f} MB, to the box")
        folder = await send(conn, python, files)
    progress(f"installing tfrun {version} into {venv}" + ("" if offline else " (dependencies from the box's index)"))
    await pip_install(conn, venv, folder, wheel.name, offline, {"version": version, "digest": digest})
