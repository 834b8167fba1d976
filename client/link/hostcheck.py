"""`tfrun hosts check`: each step from SSH to a ready box reported as it passes or fails: the connection and
host key, tfrund and its version, the daemon, the transport, and the doctor's checks run with the job interpreter."""

from __future__ import annotations

from typing import Callable, Union

from tfrun import __version__
from tfrun.constants import EXIT_DAEMON, EXIT_FAILURE, EXIT_OK
from tfrun.protocol.channel import Channel, RemoteError

from ..calls import admin
from ..config.settings import Host
from ..errors import TfrunError
from .remotecommand import remote_command
from .ssh import can_forward, fix_hint, open_channel, open_ssh, run_command

# How `check` reports a step: passed (True) or failed (False), or a doctor's check by its status.
Report = Callable[[Union[bool, str], str], None]


async def check(host: Host, accept_new: bool, report: Report) -> int:
    """`tfrun hosts check`: each step reported as it passes or fails; the exit code (docs/reference/exit-codes.md):
    125 where a step on the way to the daemon failed (ssh, tfrund, the daemon), as any verb exits that
    cannot reach it; 1 where the daemon answered but the box is not ready for jobs (another tfrund version,
    a doctor's check failed: no TensorFlow in the job python, say), as `tfrun doctor` exits; else 0."""
    try:
        conn = await open_ssh(host, accept_new)
    except TfrunError as exc:
        report(False, f"ssh: {exc.message}")
        return EXIT_DAEMON
    try:
        key = conn.get_server_host_key()
        fingerprint = key.get_fingerprint() if key else "?"
        report(
            True, f"ssh: connected to {host.destination} as {conn.get_extra_info('username')}, host key {fingerprint}"
        )
        status, out = await run_command(conn, remote_command(host, "--version"))
        if status != 0:
            report(False, f"tfrund: {host.tfrund!r} not found on the box (exit {status}): {fix_hint(host)}")
            return EXIT_DAEMON
        box_version = out.split()[-1] if out.split() else "?"
        same_version = box_version == __version__
        report(same_version, f"tfrund: {out.strip()}" if same_version else f"tfrund: the box has {box_version}, this "
               f"client {__version__}: {fix_hint(host, upgrade=True)}")  # fmt: skip
        try:
            channel, _ = await open_channel(conn, host)
        except (TfrunError, RemoteError) as exc:
            report(False, f"daemon: {exc}")
            return EXIT_DAEMON
        report(True, f"daemon: running, tfrund {channel.daemon.version}, protocol {channel.daemon.protocol}")
        info = await admin.daemon_status().on(channel)
        if await can_forward(conn, info.socket):
            report(True, f"transport: socket forwarding to {info.socket}")
        else:
            report(True, "transport: socket forwarding refused by the server; using tfrund dial-stdio (slower)")
        ready = await _doctor(channel, host, report)
        return EXIT_OK if same_version and ready else EXIT_FAILURE
    finally:
        conn.close()


async def _doctor(channel: Channel, host: Host, report: Report) -> bool:
    """The doctor's checks (TensorFlow, CUDA build, GPUs, driver, checkpoint root), run by the daemon with the
    interpreter jobs will get: the host's `python`, else tfrund's job_python. A box whose jobs cannot import
    TensorFlow is not ready, however well ssh works; True if nothing failed."""
    checks = await admin.doctor(host.python).on(channel)
    for line in checks:
        report(line.status, f"{line.name}: {line.detail}" + (f"; {line.advice}" if line.advice else ""))
    return all(line.status != "fail" for line in checks)
