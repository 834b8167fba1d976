"""Each job's checkpoint folder: its alone, on a root that other daemons and other users may share.

A job's folder is `ROOT/N-ID` (`Store.create_job`): N its id, ID the random id of its daemon's database
(`Store.daemon_id`), so that two homes on one root (two daemons of one user, or of two users) never name the
same folder; a restart uses its first job's, and the job finds its own in TFRUN_CHECKPOINT_DIR. The folder is
made when the job is built, exclusively and 0700: one that exists already is taken only if it is a folder of
this user's made by this daemon (a build that a stopped daemon did not finish) or the folder a restart shares,
never one another user put there first (on a shared 1777 root, anyone can make `ROOT/N-ID` before the job
does). `tfrun rm --checkpoints` and `prune --checkpoints` delete only folders that `made_here` recognises.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from tfrun.constants import PRIVATE_DIR_MODE
from tfrun.runner.records.job import JobRow


class CheckpointsTaken(OSError):
    """The job's checkpoint folder exists and is not this job's: it does not start (the message says why)."""


def claim(row: JobRow, daemon_id: str) -> None:
    """Create the job's checkpoint folder (0700, exclusively), or accept it if it is already the job's own;
    CheckpointsTaken if anything else is in its place."""
    folder = Path(row.checkpoint_dir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=PRIVATE_DIR_MODE)
        return
    except FileExistsError:
        pass
    st = folder.lstat()
    mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
    if mine and (row.spec.restart_of is not None or _named_here(folder, daemon_id)):
        return
    raise CheckpointsTaken(
        f"checkpoint folder {folder} already exists and is not this job's ({_what(st)}); remove it, or set "
        "checkpoint_root to a folder of your own"
    )


def made_here(folder: Path, daemon_id: str) -> bool:
    """Whether `folder` is a checkpoint folder this daemon made: a real folder of this user's named for this
    daemon's database. Only those are ever deleted; another home's, another user's, a link, or one of an older
    tfrun (named by the job's id alone, which another home may share) are left."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and _named_here(folder, daemon_id)


def _named_here(folder: Path, daemon_id: str) -> bool:
    return folder.name.endswith(f"-{daemon_id}")


def _what(st: os.stat_result) -> str:
    """What is in the way, in the user's words: whose it is, or what kind of thing."""
    if st.st_uid != os.getuid():
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return f"it belongs to {owner}"
    if not stat.S_ISDIR(st.st_mode):
        return "it is a link" if stat.S_ISLNK(st.st_mode) else "it is not a folder"
    return "this daemon did not make it"
