"""`tfrund doctor` / `tfrun doctor`: is this box ready to train? One line per check, each passing or saying
what to do, after the check script of ../shared/seeds/004: the job interpreter and its TensorFlow (built
with CUDA, the GPUs it sees, memory growth), the driver as nvidia-smi reports it, and the checkpoint root.

TensorFlow is probed in the job interpreter (jobs/probe.py, `tfrun.jobs.probe`), never in the daemon's, which may have
none. When the job interpreter cannot import it, the interpreters on the box that can are named, from a
short search (`pythons_with_tensorflow`), with how to choose one. No GPU at all is a warning, not a failure:
CPU boxes are allowed; a GPU that nvidia-smi sees and TensorFlow does not is a failure, since that job would
silently train on the CPU.

The search runs what it finds, with the user's rights: on a shared box a conda folder the team may write, or a
PATH entry of someone else's, would have the doctor run another user's program. So an interpreter is run only
if no one but root and the user could have put it there or changed it (`changeable_by_others`: the file, each
folder on the way to it, each link followed); the others are named as not run, with the reason.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tfrun.constants import PYTHON_SEARCH_MAX, PYTHON_SEARCH_TIMEOUT_S, PYTHON_SEARCH_WORKERS, PYTHONS_NAMED
from tfrun.paths import package_folder
from tfrun.protocol.admin import Check
from tfrun.shorten import shorten

from .workdir.checkpoints import RootOpen, check_root

OK, WARN, FAIL = "ok", "warn", "fail"
_PROBE = package_folder("tfrun.jobs") / "probe.py"
_PROBE_TIMEOUT_S = 180  # importing TensorFlow on a cold disk takes a while
_PROBE_ERROR_CHARS = 300  # why the job python cannot import TensorFlow: its error's first line, shortened
_LOW_SPACE_BYTES = 10 * 10**9
# Where people keep interpreters with TensorFlow besides PATH: conda's base and envs, pyenv, and venvs under ~
# (one per project, or .venv inside a project). Patterns, not a walk: a big home costs a few listings.
_CONDA_ROOTS = ("~/miniconda3", "~/anaconda3", "~/miniforge3", "~/mambaforge", "/opt/conda")
_VENV_PATTERNS = (
    "~/.venv*/bin/python",
    "~/venv*/bin/python",
    "~/venvs/*/bin/python",
    "~/.virtualenvs/*/bin/python",
    "~/*/bin/python",
    "~/*/.venv/bin/python",
    "~/*/venv/bin/python",
    "~/.pyenv/versions/*/bin/python",
)
# Run by each candidate: can it find TensorFlow (found, not imported: importing takes seconds), which version.
# Python 3.6+ and the standard library only; run from / so that a folder named tensorflow there cannot count.
_FIND_TENSORFLOW = """
import importlib.util, json, sys
found = importlib.util.find_spec("tensorflow") is not None
version = None
if found:
    try:
        from importlib.metadata import version as dist_version
    except ImportError:
        dist_version = None
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-intel",
                 "tensorflow-macos", "tensorflow-rocm", "tensorflow-aarch64", "intel-tensorflow"):
        try:
            version = dist_version(dist)
            break
        except Exception:
            pass
print(json.dumps({"prefix": sys.prefix, "tensorflow": found, "version": version}))
"""


def run_checks(checkpoint_root: Path, python: str, checkpoints_to: Optional[str] = None) -> list[Check]:
    """Every check, in the order a person would fix things; the box's object storage where it has a default."""
    checks: list[Check] = []
    search = Search()
    interpreter = _interpreter(python, search)
    checks.append(interpreter[0])
    smi = _nvidia_smi()
    checks.extend(smi[0])
    if interpreter[1] is not None:
        checks.extend(_tensorflow(interpreter[1], search, gpus_by_driver=smi[1]))
    checks.append(_growth_default())
    checks.append(_checkpoint_root(checkpoint_root))
    if checkpoints_to:
        checks.append(_storage(checkpoints_to))
    if search.skipped:
        checks.append(Check("interpreters not run", WARN, "; ".join(search.skipped),
                            "another user could have put or changed them: fix their owner or mode to have them "
                            "looked at"))  # fmt: skip
    return checks


def _storage(where: str) -> Check:
    """Whether [storage] checkpoints_to answers with this box's credentials: one listing of its prefix."""
    from tfrun.storage.credentials import settings_for
    from tfrun.storage.place import PlaceError, parse
    from tfrun.storage.remote import Remote, StorageError

    try:
        remote = Remote(parse(where))
        remote.listing(".tfrun/")
    except (PlaceError, StorageError) as exc:
        advice = "checkpoints wait on the box until it answers: docs/how-to/checkpoints.md"
        return Check("object storage", FAIL, str(exc), advice)
    return Check("object storage", OK, f"{where} answers (credentials: {settings_for(parse(where)).source})")


def job_python(configured: Optional[str]) -> str:
    """The interpreter a .py job gets by default: the setting, else python3 on the daemon's PATH, else the
    daemon's own."""
    return configured or shutil.which("python3") or sys.executable


def _interpreter(python: str, search: Search) -> tuple[Check, Optional[str]]:
    found = python if os.sep in python else shutil.which(python)
    if found is None or not os.access(found, os.X_OK):
        return Check("job python", FAIL, f"{python} is not an executable", search.advice(python)), None
    why = changeable_by_others(found)
    if why is not None:  # jobs would run it too: named, never run here
        return Check("job python", FAIL, f"{found} could be changed by another user ({why}): not run",
                     search.advice(found)), None  # fmt: skip
    return Check("job python", OK, found), found


def _tensorflow(python: str, search: Search, gpus_by_driver: int) -> list[Check]:
    try:
        result = subprocess.run(
            [python, str(_PROBE)], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
        found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return [Check("tensorflow", FAIL, f"could not run the probe in {python}: {exc}")]
    if "error" in found:
        why = shorten(found["error"], _PROBE_ERROR_CHARS)
        return [Check("tensorflow", FAIL, f"not importable ({why})", search.advice(python))]
    checks = [Check("tensorflow", OK, f"{found['tensorflow']} on Python {found['python']}")]
    cuda = found.get("cuda_build")
    versions = ", ".join(f"{k} {found[k]}" for k in ("cuda", "cudnn") if found.get(k)) or "no CUDA"
    if cuda:
        checks.append(Check("built with CUDA", OK, versions))
    else:
        checks.append(Check("built with CUDA", WARN if not gpus_by_driver else FAIL, "no: a CPU-only build",
                            "install the GPU build (the tensorflow/tensorflow:*-gpu image has it)"))  # fmt: skip
    gpus = found.get("gpus") or []
    if gpus:
        checks.append(Check("GPUs seen by TensorFlow", OK, f"{len(gpus)}: {', '.join(gpus)}"))
    elif gpus_by_driver:
        checks.append(Check("GPUs seen by TensorFlow", FAIL, f"none, though nvidia-smi sees {gpus_by_driver}",
                            "a CUDA/cuDNN this TensorFlow was not built for (TF 2.9 needs CUDA 11.2 and cuDNN "
                            "8.1), or LD_LIBRARY_PATH lacks the CUDA libraries"))  # fmt: skip
    else:
        checks.append(Check("GPUs seen by TensorFlow", WARN, "none: jobs train on the CPU"))
    growth = found.get("memory_growth")
    if gpus:
        status = OK if growth == "ok" else FAIL
        checks.append(Check("memory growth", status, "applied on every GPU" if status == OK else str(growth)))
    return checks


@dataclass(frozen=True)
class Interpreter:
    """A Python on this box that can import TensorFlow (`version`: its distribution's, when it says)."""

    path: str
    version: Optional[str]


class Search:
    """The search for interpreters with TensorFlow, made at most once per doctor run, when advice needs it;
    `skipped` then names those not run, each with why."""

    def __init__(self) -> None:
        self.skipped: list[str] = []
        self._found: Optional[list[Interpreter]] = None

    def advice(self, python: str) -> str:
        """What to do about a job interpreter without TensorFlow: the ones on this box that have it, and the
        two ways jobs get one (per host from the client, or for every client in tfrund's config)."""
        if self._found is None:
            self._found, self.skipped = pythons_with_tensorflow()
        choose = "`tfrun hosts add NAME --python PATH` (or job_python in tfrund's config.toml)"
        found = [other for other in self._found if other.path != python]
        if not found:
            return (
                f"install TensorFlow for {python}; no other interpreter here has it (looked at python3 on PATH, "
                f"conda envs, venvs under ~), then choose one with {choose}"
            )
        named = ", ".join(f"{other.path} (TensorFlow {other.version or '?'})" for other in found[:PYTHONS_NAMED])
        more = f" and {len(found) - PYTHONS_NAMED} more" if len(found) > PYTHONS_NAMED else ""
        return f"TensorFlow is in {named}{more}: choose one with {choose}, or install TensorFlow for {python}"


def pythons_with_tensorflow() -> tuple[list[Interpreter], list[str]]:
    """Interpreters on this box that can import TensorFlow, in the order of `python_candidates`, one for each
    environment (its sys.prefix), and the candidates not run (`PATH (why)`). Each candidate runs a short
    script, several at once, none for long: a search of seconds at most, run only when the job interpreter has
    no TensorFlow, off the daemon's event loop."""
    candidates, skipped = python_candidates()
    with ThreadPoolExecutor(PYTHON_SEARCH_WORKERS) as pool:
        answers = list(pool.map(_find_tensorflow, candidates))
    prefixes: set[str] = set()
    found: list[Interpreter] = []
    for path, answer in zip(candidates, answers):
        if answer is not None and answer[0] not in prefixes:
            prefixes.add(answer[0])
            found.append(Interpreter(path, answer[1]))
    return found, skipped


def python_candidates() -> tuple[list[str], list[str]]:
    """Executables that may be Pythons with TensorFlow: python3 and python on PATH, then conda's, then venvs
    and pyenv's under ~ (see _CONDA_ROOTS, _VENV_PATTERNS); at most PYTHON_SEARCH_MAX. Those another user
    could have changed are not candidates: they come second, as `PATH (why)`."""
    found = [shutil.which("python3"), shutil.which("python")]
    for root in _CONDA_ROOTS:
        base = os.path.expanduser(root)
        found.append(os.path.join(base, "bin", "python"))
        found.extend(sorted(glob.glob(os.path.join(base, "envs", "*", "bin", "python"))))
    for pattern in _VENV_PATTERNS:
        found.extend(sorted(glob.glob(os.path.expanduser(pattern))))
    unique = list(dict.fromkeys(path for path in found if path and os.access(path, os.X_OK)))[:PYTHON_SEARCH_MAX]
    safe, skipped = [], []
    for path in unique:
        why = changeable_by_others(path)
        if why is None:
            safe.append(path)
        else:
            skipped.append(f"{path} ({why})")
    return safe, skipped


_MAX_LINKS = 40  # as the kernel's: a loop of links is refused, not followed forever


def changeable_by_others(path: str) -> Optional[str]:
    """Why another user could have put the program at `path` there or changed it, or None when only root and
    this user could: walked name by name as the kernel resolves it, every folder looked in, every link
    followed (its owner too: in a sticky folder a link's owner may change it) and the file itself must be
    root's or this user's, and none writable by group or others, except a sticky folder (/tmp: others make
    names there, never replace ours)."""
    uid = os.geteuid()
    pending = list(Path(os.path.abspath(path)).parts[1:])
    current, links = Path("/"), 0
    why = _writable_by_others(current, os.lstat(current), uid)
    while why is None and pending:
        name = pending.pop(0)
        if name in (".", ".."):
            current = current.parent if name == ".." else current
            continue
        entry = current / name
        try:
            info = os.lstat(entry)
        except OSError as exc:
            return f"{entry}: {exc.strerror or exc}"
        if stat.S_ISLNK(info.st_mode):  # its mode means nothing; its owner may repoint it
            if info.st_uid not in (0, uid):
                return f"{entry} is owned by uid {info.st_uid}"
            links += 1
            if links > _MAX_LINKS:
                return f"{path}: too many levels of symbolic links"
            target = Path(os.readlink(entry))
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
            current = Path("/") if target.is_absolute() else current
            continue
        why = _writable_by_others(entry, info, uid)
        current = entry
    return why


def _writable_by_others(entry: Path, info: os.stat_result, uid: int) -> Optional[str]:
    """Why `entry` (lstat'ed as `info`) lets another user change what it holds, or None."""
    if info.st_uid not in (0, uid):
        return f"{entry} is owned by uid {info.st_uid}"
    if info.st_mode & 0o022 and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        return f"{entry} may be written by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _find_tensorflow(python: str) -> Optional[tuple[str, Optional[str]]]:
    """(sys.prefix, TensorFlow's version or None) if `python` can find TensorFlow; None if not, or if it is no
    Python that answers in time."""
    try:
        result = subprocess.run(
            [python, "-c", _FIND_TENSORFLOW], capture_output=True, text=True, cwd="/",
            timeout=PYTHON_SEARCH_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(found, dict) or found.get("tensorflow") is not True:
        return None
    version = found.get("version")
    return str(found.get("prefix")), version if isinstance(version, str) else None


def _nvidia_smi() -> tuple[list[Check], int]:
    """(checks, how many GPUs the driver reports)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        advice = "on a GPU host, run the container with --gpus all (NVIDIA Container Toolkit)"
        return [Check("NVIDIA driver", WARN, "nvidia-smi not found: no GPU visible", advice)], 0
    try:
        listing = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        header = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Check("NVIDIA driver", FAIL, f"nvidia-smi failed: {exc}")], 0
    if listing.returncode != 0:
        reason = (listing.stderr or listing.stdout).strip().splitlines()
        return [Check("NVIDIA driver", FAIL, f"nvidia-smi: {reason[0] if reason else 'failed'}")], 0
    rows = [[part.strip() for part in line.split(",")] for line in listing.stdout.strip().splitlines() if line]
    cuda = next(
        (line.split("CUDA Version:")[1].split()[0] for line in header.splitlines() if "CUDA Version:" in line), "?"
    )
    driver = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    names = "; ".join(f"{row[0]} ({row[2]})" if len(row) > 2 else row[0] for row in rows)
    return [Check("NVIDIA driver", OK, f"driver {driver}, CUDA {cuda}; {len(rows)} GPU(s): {names}")], len(rows)


def _growth_default() -> Check:
    value = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None or value.lower() == "true":
        return Check("GPU memory growth for jobs", OK, "TF_FORCE_GPU_ALLOW_GROWTH=true unless a job sets it")
    return Check("GPU memory growth for jobs", WARN, f"the daemon's environment sets TF_FORCE_GPU_ALLOW_GROWTH={value}",
                 "each job takes all of every GPU's memory; unset it to share GPUs")  # fmt: skip


def _checkpoint_root(root: Path) -> Check:
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".tfrun-doctor-"):
            pass
        free = shutil.disk_usage(root).free
    except OSError as exc:
        return Check("checkpoint root", FAIL, f"{root} is not writable: {exc.strerror or exc}",
                     "mount a writable volume there, or set checkpoint_root")  # fmt: skip
    try:
        check_root(root)
    except RootOpen as exc:
        return Check("checkpoint root", FAIL, exc.detail, exc.fix)
    detail = f"{root}: writable, {free / 1e9:.1f} GB free"
    if free < _LOW_SPACE_BYTES:
        return Check("checkpoint root", WARN, detail, "under 10 GB: checkpoints of a large model may not fit")
    return Check("checkpoint root", OK, detail)
