"""The shim: one small process per job, the job's parent, that outlives tfrund (after conmon and containerd-shim).

`python -m tfrun.runner.shim JOB_DIR`, started by the daemon in a new session. It forks once, so the
daemon can reap its first process at once and the shim lives on as nobody's child; then it starts the job
in a process group of its own with stdout and stderr on the job's log file (no pipe that a dead daemon
could leave full), waits for it, and writes exit.json once nothing of the job is left. While it waits it
notes the log's growth in the job's (offset, time) index every 0.1 s (runner/shim/logindex.py).

Cancel is SIGTERM to the shim: it signals the job's group and every other descendant, waits the grace
period from cancel.json, then SIGKILLs what is left. The shim owns that timer, so a daemon that dies in the
middle of a cancel does not stop the escalation. Descendants that leave the group (setsid, double fork)
are still found: the shim is their subreaper. A launch record with `term_leader_only` (a multi-node Slurm job,
runner/shim/slurmtask.py) has the SIGTERM go to the job's first process alone, which stops the rest its own way;
the SIGKILL after the grace still goes to all.

`python -m tfrun.runner.shim --batch JOB_DIR` is the same shim as a Slurm batch script's process
(runner/executors/slurm/): no fork (the allocation ends with the batch script), the allocation's environment under
the launch record's, and a SIGTERM without cancel.json (Slurm's, before a time limit) recorded as such.
A Slurm job that Slurm requeued runs its batch script again in the same folder: the shim then moves the
earlier run's exit record aside (so that nobody takes it for this run's end), says so in the log, and
records which run it is (SLURM_RESTART_COUNT) in shim.json.

A job given GPUs by a daemon that leases them (runner/shim/gpulease.py; TFRUN_GPU_LEASES in its launch record's
environment names the daemon's claims) runs only once its shim holds a lease of its own on each, taken over from
the daemon's claim without a gap; the job sees its shim's in TFRUN_GPU_LEASES. The shim lets them go once the job
has ended, before it records the end (so the daemon finds the GPUs free when it learns of it); however the shim
dies, the kernel frees them. A lease found held by someone else (a pass of another daemon cannot do that, but a job
started again at daemon start can) is the job's failure to start, saying whose: it does not run on a GPU someone
else has.

Standard library only, and no more of it than needed: it starts once per job.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tfrun.constants import DEFAULT_GRACE_S, JOB_UMASK_ENV
from tfrun.numerals import is_digits

from . import cgroup, gpulease, jobdir, logindex
from .process import Identity, descendants

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:  # no typing or pathlib at run time: the shim starts once per job and should start fast
    from typing import Optional

    from .jobdir import ExitRecord, LaunchRecord, ShimRecord

_PR_SET_CHILD_SUBREAPER = 36
_HANDLED = (signal.SIGTERM, signal.SIGCHLD, signal.SIGINT, signal.SIGHUP)


def _job_umask() -> int:
    """The umask the user's daemon was started with (JOB_UMASK_ENV, set by tfrund), for the job itself: its
    outputs follow the user's habit, in folders that are the user's alone. Absent (a shim that no tfrund
    started), the shim's own."""
    current = os.umask(0o077)
    os.umask(current)
    try:
        return int(os.environ.get(JOB_UMASK_ENV, ""), 8) & 0o777
    except ValueError:
        return current


def _become_subreaper() -> None:
    """Orphans of the job get reparented to us instead of init, so we can find and reap them."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux, or no prctl: the process group still covers well-behaved jobs


class Shim:
    def __init__(self, job_dir: str, launch: LaunchRecord) -> None:
        self.job_dir = job_dir
        self.launch = launch
        self.job_pid = 0
        self.started_at = 0.0
        self.status: Optional[int] = None  # the job leader's wait status, once reaped
        self.exited_at: Optional[float] = None
        self.deadline: Optional[float] = None  # when to SIGKILL what is left
        self.killed = False
        self.cancelled = False
        self.batch = False  # run as a Slurm batch script (`--batch`), not forked away from a daemon
        self.stopped = False  # (batch) stopped by Slurm's SIGTERM, not by a tfrun cancel
        self.slurm_restarts = 0  # (batch) how often Slurm had requeued the job when this run began
        self.log_fd = -1
        self.index_fd = -1
        self.indexed = 0  # the log's size at the last index record
        self.next_tick = 0.0  # when to look at the log's size again
        self.leases: list[gpulease.Lease] = []  # held from before the job starts until it has ended

    def start(self) -> None:
        """Start the job with its output on the log file; on failure, record it as the job's exit."""
        log = os.open(os.path.join(self.job_dir, jobdir.OUTPUT), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.slurm_restarts:
            os.write(log, f"tfrun: Slurm requeued this job; it starts again (run {self.slurm_restarts + 1})\n".encode())
        self._take_leases(log)
        oom_file = cgroup.oom_counter_file()  # the job inherits our cgroup: its OOM kills count there
        oom_kills = cgroup.oom_kills(oom_file)
        tfrun_umask = os.umask(_job_umask())  # the job's own; the shim's files stay private (077)
        try:
            # posix_spawn rather than subprocess (which costs the shim ~15 ms of imports a job): the job gets
            # a session and process group of its own, an empty signal mask, /dev/null in, the log out.
            os.chdir(self.launch["cwd"])
            pid = os.posix_spawn(
                self.launch["command"][0],
                self.launch["command"],
                self.launch["env"],
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                ],
                setsid=True,
                setsigmask=(),
            )
            os.umask(tfrun_umask)
        except OSError as exc:
            os.umask(tfrun_umask)
            os.write(log, f"tfrun: cannot start {self.launch['command'][0]}: {exc.strerror}\n".encode())
            self._write_exit(code=127, sig=None, started=time.time(), error=f"cannot start: {exc.strerror}")
            raise SystemExit(0) from None
        except BaseException:
            os.close(log)
            raise
        self.log_fd = log
        self.index_fd = os.open(os.path.join(self.job_dir, jobdir.INDEX), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.indexed = os.fstat(log).st_size
        self.job_pid = pid
        self.started_at = time.time()
        me, job = Identity.of(os.getpid()), Identity.of(self.job_pid)
        record: ShimRecord = {
            "shim_pid": os.getpid(),
            "shim_start": me.start if me else None,
            "boot_id": me.boot if me else None,
            "job_pid": self.job_pid,
            "job_start": job.start if job else None,
            "started_at": self.started_at,
            "oom_file": oom_file,
            "oom_kills": oom_kills,
        }
        if self.batch:
            record["slurm_restarts"] = self.slurm_restarts
        jobdir.write_json(os.path.join(self.job_dir, jobdir.SHIM), record)

    def _take_leases(self, log: int) -> None:
        """Hold the job's GPU leases before it starts; if one is someone else's, record that as its exit."""
        paths = self.launch["env"].get(gpulease.LEASES_ENV)
        if not paths:
            return
        try:
            taken = gpulease.take_over(paths.split(os.pathsep))
        except gpulease.LeaseError as exc:
            taken = str(exc)
        if isinstance(taken, str):
            why = f"{taken}; submit it again"
            os.write(log, f"tfrun: not started: {why}\n".encode())
            self._write_exit(code=127, sig=None, started=time.time(), error=f"not started: {why}")
            raise SystemExit(0)
        self.leases = taken
        self.launch["env"][gpulease.LEASES_ENV] = os.pathsep.join(lease.path for lease in taken)

    def run(self) -> None:
        """Wait for the job and everything it started; handle cancel; record the exit."""
        while True:
            self._index()
            now = time.time()
            timeout = self.next_tick - now
            if self.deadline is not None:
                timeout = min(timeout, self.deadline - now)
            if self.status is not None:
                timeout = min(timeout, 0.05)  # poll leftovers we did not start
            info = signal.sigtimedwait(_HANDLED, timeout) if timeout > 0 else None
            if info is not None and info.si_signo == signal.SIGTERM:
                self._cancel()
            self._reap()
            if self.deadline is not None and time.time() >= self.deadline and not self.killed:
                self._signal_all(signal.SIGKILL)
                self.killed = True
            if self.status is not None and not self._anything_left():
                break
            if self.status is not None and self.deadline is None:
                # The job ended but left processes behind: they belong to it, so they go too.
                self._signal_all(signal.SIGTERM)
                self.deadline = time.time() + self._grace()
        self.next_tick = 0.0
        self._index()  # the last bytes, before exit.json says there will be no more
        for lease in self.leases:
            gpulease.release(lease)
        code, sig = _decode(self.status if self.status is not None else 0)
        stopped = (
            "stopped by Slurm (SIGTERM): its time limit was near, it was preempted or requeued"
            if self.stopped
            else None
        )
        self._write_exit(code=code, sig=sig, started=self.started_at, error=stopped)

    def _index(self) -> None:
        """Once per INDEX_INTERVAL_S: if the log grew, note its new size and the time (runner/shim/logindex.py)."""
        now = time.time()
        if now < self.next_tick:
            return
        self.next_tick = now + logindex.INDEX_INTERVAL_S
        try:
            size = os.fstat(self.log_fd).st_size
            if size > self.indexed:
                logindex.append(self.index_fd, size, now)
                self.indexed = size
        except OSError:
            pass  # a full disk, say: the index only loses precision; the job must not suffer for it

    def _cancel(self) -> None:
        if self.cancelled or self.stopped:
            return
        if self.batch and not os.path.exists(os.path.join(self.job_dir, jobdir.CANCEL)):
            # Not tfrun's cancel (which writes cancel.json first): Slurm's own SIGTERM, before its time limit
            # (--signal=B:TERM@grace) or a preemption. The job fails, saying so; the grace holds all the same.
            self.stopped = True
        else:
            self.cancelled = True
        if self.launch.get("term_leader_only"):
            _kill(self.job_pid, signal.SIGTERM)  # it stops the rest itself, within the grace
        else:
            self._signal_all(signal.SIGTERM)
        self.deadline = time.time() + self._grace()

    def _grace(self) -> float:
        try:
            request = jobdir.read_cancel(os.path.join(self.job_dir, jobdir.CANCEL)) or {}
        except ValueError:
            request = {}
        grace = request.get("grace", self.launch.get("grace", DEFAULT_GRACE_S))
        return float(grace) if isinstance(grace, (int, float)) else DEFAULT_GRACE_S

    def _reap(self) -> None:
        """Collect every child that ended: the job, and orphans the subreaper inherited."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.job_pid:
                self.status = status
                self.exited_at = time.time()

    def _anything_left(self) -> bool:
        try:
            os.killpg(self.job_pid, 0)
            return True
        except ProcessLookupError:
            pass
        except PermissionError:
            return True
        return bool(descendants(os.getpid()))

    def _signal_all(self, sig: int) -> None:
        """`sig` to the job's process group and to every descendant, in or out of that group."""
        _kill(self.job_pid, sig, group=True)
        for pid in descendants(os.getpid()):
            _kill(pid, sig)

    def _write_exit(self, code: int, sig: Optional[int], started: float, error: Optional[str] = None) -> None:
        """Record how the job ended in exit.json; if the job folder takes no more writes (remounted read-only,
        a full disk), in the spare record the daemon reserved elsewhere, saying why: the job's true exit code
        must reach the daemon either way."""
        record: ExitRecord = {
            "exit_code": code,
            "signal": sig,
            "started_at": started,
            "finished_at": self.exited_at or time.time(),
            "ended_at": time.time(),
            "cancelled": self.cancelled,
            "error": error,
        }
        if self.stopped:
            record["stopped"] = True
        try:
            jobdir.write_json(os.path.join(self.job_dir, jobdir.EXIT), record)
        except OSError as exc:
            spare = self.launch.get("spare_exit")
            if not spare:  # a launch record from a tfrund before spare records
                raise
            why = f"job folder not writable: {exc.strerror}"
            record["error"] = f"{why}; {error}" if error else why
            jobdir.fill(spare, record)


def _set_aside_earlier_run(job_dir: str) -> int:
    """(batch) Which run of its Slurm job this is (0: the first; SLURM_RESTART_COUNT after a requeue). An exit
    record already in the folder is an earlier run's, killed by the requeue: renamed exit.json.run-N (N: the
    run it ended), so that the daemon waits for this run's."""
    count = os.environ.get("SLURM_RESTART_COUNT", "")
    restarts = int(count) if is_digits(count) else 0
    earlier = os.path.join(job_dir, jobdir.EXIT)
    if os.path.exists(earlier):
        os.replace(earlier, f"{earlier}.run-{max(restarts - 1, 0)}")
    return restarts


def _kill(pid: int, sig: int, group: bool = False) -> None:
    """Signal a process (or its group) that may be gone already. Not contextlib: one import less a job."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _decode(status: int) -> tuple[int, Optional[int]]:
    """(exit code as a shell reports it, signal number or None) from a wait status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.WEXITSTATUS(status), None


def main(argv: list[str]) -> None:
    """`shim JOB_DIR`: fork away from the daemon (LocalExecutor). `shim --batch JOB_DIR`: stay in the
    foreground, as the batch script's own process (runner/executors/slurm/): the allocation lives exactly as long as
    this process, so it must not fork away, and the job's environment is the allocation's (SLURM_*, the
    CUDA_VISIBLE_DEVICES Slurm chose) with the launch record's on top."""
    batch = argv[1] == "--batch" if len(argv) > 2 else False
    job_dir = argv[2] if batch else argv[1]
    launch = jobdir.read_launch(os.path.join(job_dir, jobdir.LAUNCH))
    if launch is None:
        raise SystemExit(f"tfrun shim: no {jobdir.LAUNCH} in {job_dir}")
    # Block the signals we handle before forking, so none is lost between here and sigtimedwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
    if batch:
        launch["env"] = {**os.environ, **launch["env"]}
        _become_subreaper()
        shim = Shim(job_dir, launch)
        shim.batch = True
        shim.slurm_restarts = _set_aside_earlier_run(job_dir)
        shim.start()
        shim.run()
        # The job's own code, so that Slurm's accounting (COMPLETED, FAILED) tells the truth too.
        raise SystemExit(_decode(shim.status if shim.status is not None else 0)[0])
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        # The daemon's child: report whether the job started, then exit so the daemon can reap us.
        os.close(ready_w)
        ok = os.read(ready_r, 1)
        os._exit(0 if ok == b"1" else 1)
    os.close(ready_r)
    _become_subreaper()
    shim = Shim(job_dir, launch)
    try:
        shim.start()
    except SystemExit:
        os.write(ready_w, b"1")  # the failure to start is recorded in exit.json: the daemon reads it there
        raise
    os.write(ready_w, b"1")
    os.close(ready_w)
    shim.run()


if __name__ == "__main__":
    main(sys.argv)
