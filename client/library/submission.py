"""What a submit does, under `AsyncClient.submit`: the options checked, the work dir's snapshot hashed, the
request built from `JobOptions`, then the upload and the submit, sent again on a new connection if the daemon
goes away before answering (its `submission_id` makes that safe: the daemon that took it answers with the
job it made)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Union

from tfrun import restarts
from tfrun.constants import EXIT_DAEMON, EXIT_USAGE
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.jobs import Job
from tfrun.protocol.submit import ArrayAxis, JobOptions, Submit, SubmitArray
from tfrun.protocol.wire import ConnectionClosed, ProtocolError

from ..errors import TfrunError
from ..link.connection import Target

if TYPE_CHECKING:
    from ..files.snapshot import Snapshot
    from ..link.follow import Connect, Notice
    from ..link.syncchannel import SyncChannel


@dataclass
class Submission:
    """A submit ready to go: the work dir's snapshot, hashed, and the request that names its files."""

    snapshot: Snapshot
    request: Union[Submit, SubmitArray]


@dataclass
class Submitted:
    """What a submit did: the job, and what its upload sent (contents the daemon held already are not sent)."""

    job: Job  # of an array, its first task
    files: int  # contents in the snapshot
    files_sent: int
    bytes_sent: int
    tasks: list[Job] = field(default_factory=list)  # of an array (submit --array), every task by index


def checked(options: JobOptions, target: Target) -> JobOptions:
    """`options` as they go to `target`: --restart-on's causes spelled out (an unknown one raises ValueError,
    before any file is read), the host's python when none is given, a local interpreter's path made absolute
    (the daemon runs in another folder), each `after` job as text."""
    causes = None if options.restart_on is None else list(restarts.parse(options.restart_on))
    python = options.python
    if python is None and target.host is not None:
        python = target.host.python
    elif python is not None and target.local and os.sep in python:
        python = str(Path(python).absolute())
    return dataclasses.replace(options, restart_on=causes, python=python, after=[str(job) for job in options.after])


def snapshot(
    script: str, workdir: Optional[Path], local: bool, on_snapshot: Callable[[Snapshot], None]
) -> tuple[Snapshot, str]:
    """The work dir's snapshot, hashed, and the script's path in it."""
    from ..files.snapshot import relative_script, scan, why_not_sent
    from ..files.transfer import LazyProgress

    root, relative = relative_script(script, workdir)
    snap = scan(root, local=local)
    if snap.find(relative) is None:
        raise TfrunError(why_not_sent(root, relative), EXIT_USAGE)
    on_snapshot(snap)
    hashing = LazyProgress(snap.total_bytes, "hashing")
    try:
        snap.hash(hashing.advance)
    finally:
        hashing.close()
    return snap, relative


def request(
    snap: Snapshot, script: str, args: Sequence[str], options: JobOptions, array: Sequence[tuple[str, Sequence[str]]]
) -> Union[Submit, SubmitArray]:
    """The submit of `script` (a path in `snap`) with `args` and `options`; with `array`'s axes, of its tasks."""
    submit = Submit(
        files=snap.entries,
        script=script,
        args=list(args),
        source=str(snap.root),
        git_commit=snap.git_commit,
        git_dirty=snap.git_dirty,
        submission_id=uuid.uuid4().hex,  # the same in every retry: a daemon that took it once returns that job
        **options.options(),
    )
    axes = [ArrayAxis(key, list(values)) for key, values in array]
    return SubmitArray(submit, axes) if axes else submit


def prepare(
    target: Target,
    script: str,
    args: Sequence[str],
    options: JobOptions,
    workdir: Optional[Path],
    array: Sequence[tuple[str, Sequence[str]]],
    on_snapshot: Callable[[Snapshot], None],
) -> Submission:
    """The submit of `script` to `target`, ready to send: options checked, then the work dir's snapshot."""
    wanted = checked(options, target)
    snap, relative = snapshot(script, workdir, target.local, on_snapshot)
    return Submission(snap, request(snap, relative, args, wanted, array))


async def send(
    target: Target, connect: Connect, notice: Notice, ready: Submission, confirm: Optional[Callable[[int, int], None]]
) -> Submitted:
    """Upload what the daemon lacks, then submit, again on a new connection if the daemon goes away."""
    from ..files.transfer import upload
    from ..link.follow import resilient

    sent_request = False  # whether the submit went out: from then on, a failure leaves its outcome unknown

    async def submitted(channel: Channel) -> Submitted:
        nonlocal sent_request
        sent, sent_bytes = await upload(channel, ready.snapshot, confirm)
        sent_request = True
        if isinstance(ready.request, SubmitArray):
            return _made(ready, (await channel.ask(ready.request)).jobs, sent, sent_bytes)
        return _made(ready, [(await channel.ask(ready.request)).job], sent, sent_bytes)

    try:
        return await resilient(submitted, connect, hello_answers=False, notice=notice)
    except (TfrunError, ProtocolError, ConnectionError) as exc:  # not RemoteError: a refusal says why itself
        code = exc.exit_code if isinstance(exc, TfrunError) else EXIT_DAEMON
        raise TfrunError(_unsubmitted(exc, sent_request), code) from None
    except RemoteError as exc:
        raise _refused(exc, target) from None


def send_here(
    channel: SyncChannel, target: Target, ready: Submission, confirm: Optional[Callable[[int, int], None]]
) -> Optional[Submitted]:
    """`send`, over the CLI's plain socket to a daemon up on this machine (client/link/syncchannel.py: a submit that
    imports no asyncio), when the upload is small (transfer.upload_here). None when it is not, or when the
    daemon went away meanwhile: `send` then does it all again, which is safe, since a daemon that took the
    submit answers its `submission_id` with the job it made."""
    from ..files.transfer import upload_here

    sent_request = False
    try:
        uploaded = upload_here(channel, ready.snapshot, confirm)
        if uploaded is None:
            return None
        sent_request = True
        if isinstance(ready.request, SubmitArray):
            return _made(ready, channel.ask(ready.request).jobs, *uploaded)
        return _made(ready, [channel.ask(ready.request).job], *uploaded)
    except (ConnectionError, ConnectionClosed):
        return None
    except (TfrunError, ProtocolError) as exc:
        code = exc.exit_code if isinstance(exc, TfrunError) else EXIT_DAEMON
        raise TfrunError(_unsubmitted(exc, sent_request), code) from None
    except RemoteError as exc:
        raise _refused(exc, target) from None


def _made(ready: Submission, jobs: list[Job], sent: int, sent_bytes: int) -> Submitted:
    """What a submit did: of an array, its first task stands for it, with every task in `tasks`."""
    tasks = jobs if isinstance(ready.request, SubmitArray) else []
    return Submitted(jobs[0], len(ready.snapshot.sources), sent, sent_bytes, tasks)


def _refused(exc: RemoteError, target: Target) -> Exception:
    """The daemon's refusal, in the words of what to do where it is a daemon too old for --array."""
    if exc.code == ErrorCode.BAD_REQUEST and f"{SubmitArray.TYPE!r}" in exc.message:  # it knows no arrays
        host = target.host
        how = f"tfrun hosts install {host.label}" if host else "tfrund stop: the next verb starts this tfrun's"
        return TfrunError(
            f"tfrund on {target.place()} is older than this tfrun and has no --array: upgrade it ({how}); "
            "nothing was submitted",
            EXIT_DAEMON,
        )
    return exc


def _unsubmitted(exc: Exception, asked: bool) -> str:
    """Why a submit failed, and whether its job may exist after all: only if the daemon went away after the
    request reached it and none came back in time to say."""
    reason = exc.message if isinstance(exc, TfrunError) else str(exc)
    if not asked:
        return f"{reason}; nothing was submitted"
    return f"{reason}; the submit was sent but never answered, so the job may exist: see `tfrun ps -a`"
