"""The wheel `tfrun hosts install` ships to a box: this client's own tfrun, zipped here, and with --offline
every wheel it needs there, resolved here for the box's Python and platform.

No tfrun package is published, so the box gets exactly what the client runs. The wheel is built by hand
rather than by pip and setuptools: it is a zip of the installed package and its metadata, so it needs no
network, no build backend in the client's venv (Python 3.12's venvs have none) and no source checkout, and
the same files always make the same bytes, which names the cached wheel. Nothing here touches the box:
client/install/onbox.py carries these files over and installs them, client/install/steps.py runs the whole install.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Optional

from tfrun.constants import EXIT_FAILURE, PRIVATE_DIR_MODE
from tfrun.paths import package_folder

from ..config import privatefiles
from ..errors import TfrunError

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every entry's time, so the same files make the same wheel
MAPPED = ("client", "runner", "jobs")  # tfrun's packages that a source tree keeps in folders of their own

# -- the wheel, built here ------------------------------------------------------------------------------------


def _package_files() -> list[tuple[str, Path]]:
    """(name in the wheel, file here) of every file of the installed tfrun package, caches and hidden files (an
    editor's) left out. In a source tree tfrun.client, .runner and .jobs are the folders client/, runner/ and
    jobs/ (the build maps them); in an installed wheel they are folders of tfrun/, walked once."""
    roots = {"tfrun": package_folder("tfrun")} | {f"tfrun/{name}": package_folder(f"tfrun.{name}") for name in MAPPED}
    found = []
    for prefix, root in roots.items():
        for folder, dirs, files in os.walk(root):
            skipped = set(MAPPED) if prefix == "tfrun" and Path(folder) == root else set()
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith(".") and d not in skipped)
            for name in sorted(files):
                if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                    path = Path(folder, name)
                    found.append((f"{prefix}/{path.relative_to(root).as_posix()}", path))
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
    base = privatefiles.private_folder(privatefiles.cache_dir()) / "wheels"  # 0700: nobody else leaves a wheel
    path = base / f"{version}-{digest[:16]}" / f"tfrun-{version}-py3-none-any.whl"
    if path.exists():
        return path, digest
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
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
