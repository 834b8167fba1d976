"""Each job's checkpoint folder: its alone, on a root that other daemons and other users may share.

A job's folder is `ROOT/N-ID` (`Store.create_job`): N its id, ID the random id of its daemon's database
(`Store.daemon_id`), so that two homes on one root (two daemons of one user, or of two users) never name the
same folder; a restart uses its first job's, and the job finds its own in TFRUN_CHECKPOINT_DIR. The folder is
made when the job is built, exclusively and 0700: one that exists already is taken only if it is a folder of
this user's made by this daemon (a build that a stopped daemon did not finish) or the folder a restart shares,
never one another user put there first (on a shared 1777 root, anyone can make `ROOT/N-ID` before the job
does). `tfrun rm --checkpoints` and `prune --checkpoints` delete only folders that `made_here` recognises.

The root itself is checked before a job's folder is made in it (`check_root`): where others may write in it, or
in a folder above it, without the sticky bit (a team folder, mode 2775), they may rename any name in it, so a
teammate could move a job's folder aside and leave a link or a folder of theirs in its place, which the job
would then write its checkpoints into. Such a root is refused, naming the folder and the fix; what the daemon
reads in a job's folder afterwards goes through a descriptor that follows no link (runner/records/jobfiles.py).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from tfrun.constants import PRIVATE_DIR_MODE

from ..records.job import JobRow


class CheckpointsTaken(OSError):
    """The job's checkpoint folder exists and is not this job's: it does not start (the message says why)."""


class RootOpen(OSError):
    """Other users may rename what is in the checkpoint root: no job's folder is made there. `detail` says
    who and where, `fix` what to do (`tfrun doctor` shows them apart)."""

    def __init__(self, root: Path, detail: str, fix: str) -> None:
        super().__init__(f"checkpoint root {root}: {detail}; {fix}")
        self.detail, self.fix = detail, fix


def claim(row: JobRow, daemon_id: str) -> None:
    """Create the job's checkpoint folder (0700, exclusively), or accept it if it is already the job's own;
    CheckpointsTaken if anything else is in its place, RootOpen if the root is not safe to make it in."""
    folder = Path(row.checkpoint_dir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    check_root(folder.parent)
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


def check_root(root: Path) -> None:
    """RootOpen unless no one but this user (and root) may rename what is in `root`: neither it nor a folder
    above it, where it is written and where its links lead, may be written by group or others without the
    sticky bit. A group of this user's alone (a user private group, with umask 002) counts as this user."""
    absolute = Path(os.path.abspath(root))
    real = Path(os.path.realpath(root))
    for folder in dict.fromkeys([absolute, *absolute.parents, real, *real.parents]):
        st = folder.stat()
        if not st.st_mode & 0o022 or st.st_mode & stat.S_ISVTX or _group_of_mine(st):
            continue
        who = "other users" if st.st_mode & 0o002 else f"group {_group_name(st.st_gid)}"
        raise RootOpen(
            root,
            f"{who} may write in {folder} (mode {stat.S_IMODE(st.st_mode):04o}) and it has no "
            "sticky bit, so they could put a link or a folder of theirs in place of a job's checkpoint folder",
            f"make it sticky (chmod +t {folder}, as its owner) or set checkpoint_root to a folder only you can write",
        )


def _group_of_mine(st: os.stat_result) -> bool:
    """Whether only the group may write (not others) and the group is this user's private one: named as the
    user, the user's primary group, with no one else in it."""
    if st.st_mode & 0o002 or st.st_gid != os.getegid():
        return False
    try:
        me, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


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
