"""What a service runs (issue 20): TensorBoard over jobs' TensorBoard folders, Jupyter in a folder of the box.

Both run with the job interpreter (the one that has TensorFlow; the daemon's own venv has neither), listen on
127.0.0.1 only (the client reaches them through SSH, client/link/forward.py), on a port the daemon picks free.
Jupyter's token is fresh for each service and passed in its environment (JUPYTER_TOKEN, which notebook 6 and
jupyter_server 2 both read), never on its command line, where any user of the box could read it in `ps`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Optional

from ..home import inherited_env
from ..shim import jobdir

TENSORBOARD, JUPYTER = "tensorboard", "jupyter"
# The alert rules that watch a service, of the daemon's: an idle notebook is no stalled job and a server's log
# holds no loss, but a kernel's OOM is the commonest GPU OOM there is.
SERVICE_RULES = ("oom", "failed", "lost")
READY_TIMEOUT_S = 180.0  # TensorBoard imports TensorFlow when it has it: 6 s here, far more on a busy box
_FIND_TIMEOUT_S = 60.0
_RUN_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # --logdir_spec splits runs on "," and a run's name on ":"


class ServiceError(Exception):
    """A service cannot be started as asked; the message says why and, where it can, what to do."""


def free_port() -> int:
    """A port free on the box's loopback now (the service binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp: TCP_LISTEN


def listeners(port: int) -> list[tuple[int, int]]:
    """(socket inode, uid) of every socket listening on TCP `port` of this box, at any address, from the
    kernel's tables (/proc/net/tcp and tcp6), which list every user's sockets."""
    found = []
    for table in _TCP_TABLES:
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 9 and row[3] == _TCP_LISTEN and int(row[1].rpartition(":")[2], 16) == port:
                found.append((int(row[9]), int(row[7])))
    return found


def socket_inodes(pids: list[int]) -> set[int]:
    """The inodes of the sockets that the processes `pids` hold open (their /proc/PID/fd links)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def listens(port: int, pids: list[int]) -> bool:
    """Whether the service's own processes (`pids`) listen on `port`; False while nothing does. Anything
    else listening there is no service of ours: another user of the box who bound the port first would be
    sent the browser's requests, a Jupyter token with them, so that is refused (ServiceError), naming it."""
    found = listeners(port)
    if not found:
        return False
    ours = socket_inodes(pids)
    if any(inode in ours for inode, _ in found):
        return True
    uids = ", ".join(str(uid) for uid in sorted({uid for _, uid in found}))
    raise ServiceError(f"port {port} is taken by another process (uid {uids}); nothing was sent to it")


def importable(python: str, modules: tuple[str, ...]) -> Optional[str]:
    """The first of `modules` that `python` can import (looked up, not imported), or None."""
    probe = (
        "import importlib.util, sys\n"
        "found = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]\n"
        "print(found[0] if found else '')\n"
    )
    try:
        result = subprocess.run(
            [python, "-c", probe, *modules],
            capture_output=True,
            text=True,
            timeout=_FIND_TIMEOUT_S,
            env=inherited_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"cannot run the job interpreter {python}: {exc}") from None
    return result.stdout.strip() or None


def run_name(job_id: int, name: Optional[str]) -> str:
    """A job's run in TensorBoard: `ID-name` (or `ID`), with what --logdir_spec cannot hold replaced."""
    return _RUN_NAME_UNSAFE.sub("_", f"{job_id}-{name}" if name else str(job_id))


def tensorboard_command(python: str, runs: list[tuple[str, Path]], port: int) -> list[str]:
    """TensorBoard over each job's TensorBoard folder as a run of its own, on 127.0.0.1:`port`."""
    if importable(python, ("tensorboard",)) is None:
        raise ServiceError(
            f"TensorBoard is not installed for the job interpreter {python}: {python} -m pip install tensorboard"
        )
    for _, folder in runs:
        if "," in str(folder):
            raise ServiceError(f"TensorBoard cannot be given {folder}: its path holds a comma (--logdir_spec)")
    spec = ",".join(f"{name}:{folder}" for name, folder in runs)
    return [python, "-m", "tensorboard.main", "--logdir_spec", spec, "--host", "127.0.0.1", "--port", str(port)]


def jupyter_command(python: str, port: int, root_dir: str) -> list[str]:
    """JupyterLab (else the classic notebook) in `root_dir`, on 127.0.0.1:`port`, no browser of its own."""
    app = importable(python, ("jupyterlab", "notebook"))
    if app is None:
        raise ServiceError(
            f"Jupyter is not installed for the job interpreter {python}: {python} -m pip install jupyterlab "
            "(or use an image with it, e.g. tensorflow/tensorflow:2.9.0-gpu-jupyter)"
        )
    folder = Path(os.path.expanduser(root_dir))
    if not folder.is_dir():
        raise ServiceError(f"--dir {root_dir!r}: no such folder on the box")
    command = [python, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
               f"--notebook-dir={folder}"]  # fmt: skip
    # A box's container runs as root (the TensorFlow images do), which Jupyter refuses unless told.
    return [*command, "--allow-root"] if os.geteuid() == 0 else command


def new_token() -> str:
    return secrets.token_hex(24)


def tensorboard_folder(job_dir: str) -> Path:
    """A job's TensorBoard folder (TFRUN_TENSORBOARD_DIR)."""
    return Path(job_dir) / jobdir.TENSORBOARD
