"""`tfrun hosts install`: put this client's own tfrun on a box, with nothing but the SSH login.

No tfrun package is published, so the box gets exactly what the client runs, the way VS Code's Remote-SSH
installs its server: a wheel built here from the installed tfrun (client/install/wheel.py), copied over the SSH
connection tfrun already makes and installed into a venv of its own on the box, so its dependencies never
touch the job interpreter (client/install/onbox.py: each step on the box), then tfrund started from it and its
path recorded for the host. Dependencies come from the box's package index, or with --offline from wheels
resolved here for the box's Python and platform and sent along.

This module is the whole install in order: what it was asked for (`Options`), what it did (`Result`), and
`install`, which skips the copy when the box has this version already.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import tfrun
from tfrun.constants import DEFAULT_BOX_VENV, EXIT_USAGE

from ..config import settings as config
from ..config.settings import Host
from ..errors import TfrunError
from .onbox import (
    BoxPython,
    box_info,
    find_python,
    make_venv,
    pip_install,
    refuse_other_folder,
    send,
    start_daemon,
    version_tuple,
)
from .wheel import build_wheel, download_dependencies

if TYPE_CHECKING:
    import asyncssh

Progress = Callable[[str], None]


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
    from ..link import ssh

    host = configured_host(name)
    assert host.name is not None
    version = tfrun.__version__
    offline = options.offline or options.wheels is not None
    conn = await ssh.open_ssh(host, accept_new)
    try:
        python = await find_python(conn, host, options.python)
        info = await box_info(conn, python, options.venv)
        refuse_other_folder(info, host)
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
    return "upgraded" if version_tuple(installed) < version_tuple(version) else "downgraded"


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
