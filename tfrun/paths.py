"""Where one daemon's files live. Every path derives from TFRUN_HOME, so isolated daemons run side by side.

The client uses this to find the local daemon's socket; the daemon uses it for everything it owns. And where
tfrun's own packages are (`package_folder`), which in a source tree is not always a folder of tfrun/.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from tfrun.constants import CONFIG_FILE

# sockaddr_un.sun_path holds 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107


def package_folder(package: str) -> Path:
    """Where a package of tfrun's is, found without importing it: runner/, client/ and jobs/ are mapped to
    tfrun.runner, .client and .jobs by the build, so in a source tree they are not folders of tfrun/."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    return Path(next(iter(spec.submodule_search_locations)))


def default_home() -> Path:
    """TFRUN_HOME, else the XDG state directory: a daemon's jobs and database are state, not config."""
    explicit = os.environ.get("TFRUN_HOME")
    if explicit:
        return Path(explicit).expanduser().absolute()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state).expanduser().absolute() / "tfrun"


@dataclass(frozen=True)
class Layout:
    """The files of the daemon whose state lives in `home`."""

    home: Path

    @classmethod
    def from_env(cls) -> Layout:
        return cls(default_home())

    @property
    def run_dir(self) -> Path:
        """The 0700 directory holding the socket: only its owner may connect."""
        return self.home / "run"

    @property
    def socket(self) -> Path:
        """The daemon's Unix socket; a short path in this user's private runtime folder (`/tmp/tfrun-UID`, or
        its fallback where another user took that name: tfrun/private.py) when the natural one would not fit.
        NotPrivate when neither is this user's alone."""
        natural = self.run_dir / "tfrund.sock"
        if len(os.fsencode(natural)) <= _MAX_SOCKET_PATH:
            return natural
        import hashlib  # here, not above: its OpenSSL costs every local `tfrun ps` some 4 ms, for a rare path

        from tfrun.private import shared_runtime_dir

        digest = hashlib.sha256(os.fsencode(self.home)).hexdigest()[:16]
        return shared_runtime_dir() / f"{digest}.sock"

    @property
    def spare_exits_dir(self) -> Path:
        """Spare exit records, outside the job folders: see spare_exit."""
        return self.run_dir / "exits"

    def spare_exit(self, job_id: int) -> Path:
        """Where the shim records the job's exit if its folder takes no writes (read-only, full): reserved by
        the daemon before the job starts, so that filling it needs no free space."""
        return self.spare_exits_dir / f"{job_id}.json"

    @property
    def database(self) -> Path:
        """The job store (SQLite, with its -wal and -shm files): every job's record and events, the alerts and
        their deliveries, the checkpoint uploads."""
        return self.home / "tfrun.db"

    @property
    def lock(self) -> Path:
        """Held (flock) by the one daemon serving this home for as long as it runs."""
        return self.run_dir / "tfrund.lock"

    @property
    def daemon_key(self) -> Path:
        """The daemon's secret, with which it proves on a remembered socket path that it is the user's own
        (tfrun/protocol/proof.py)."""
        return self.run_dir / "tfrund.key"

    @property
    def start_lock(self) -> Path:
        """Held by whoever is starting a daemon, so that racing clients start just one."""
        return self.run_dir / "start.lock"

    @property
    def daemon_log(self) -> Path:
        """The output of a daemon started in the background (by `tfrund start`, or a client on demand)."""
        return self.home / "tfrund.log"

    @property
    def jobs_dir(self) -> Path:
        """The job folders, one per job (`job_dir`)."""
        return self.home / "jobs"

    @property
    def blobs_dir(self) -> Path:
        """Uploaded file contents, named by SHA-256: what a re-submit does not send again."""
        return self.home / "blobs"

    @property
    def spares_dir(self) -> Path:
        """Ready copies of recent snapshots, which the next submit from the same folder patches."""
        return self.home / "spares"

    @property
    def config_file(self) -> Path:
        """The daemon's settings (runner/config/settings.py), which `tfrun config` shows and changes."""
        return self.home / CONFIG_FILE

    @property
    def default_checkpoint_root(self) -> Path:
        """Where each job's checkpoint folder is made, unless checkpoint_root in config.toml says elsewhere."""
        return self.home / "checkpoints"

    @property
    def job_pythonpath(self) -> Path:
        """A folder holding only `tfrun.jobs`, put on every job's PYTHONPATH."""
        return self.home / "pythonpath"

    @property
    def shim_pythonpath(self) -> Path:
        """A folder holding only what the shim runs (runner/shim/ and the tfrun modules it needs), put on
        every shim's PYTHONPATH."""
        return self.home / "shimpath"

    def job_dir(self, job_id: int) -> Path:
        """One job's folder: its snapshot, output and records (runner/shim/jobdir.py lists them)."""
        return self.jobs_dir / str(job_id)
