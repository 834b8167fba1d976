"""A real single-node Slurm cluster for the tests (issue 19): Debian's Slurm 22.05, started by hand, no systemd.

`SlurmCluster(folder)` brings up, as children of the test process and each in the foreground:

- munged, with a key, socket, pid, seed and log file of its own in `folder/munge` (never /etc/munge, never
  /run/munge: a second cluster, e.g. another test session's, runs beside it);
- MariaDB (`mariadbd`, datadir `folder/mariadb`, TCP on a free port of 127.0.0.1, grant tables skipped) and
  slurmdbd on it, so that `sacct` answers for jobs that have left `squeue` (accounting=True, the default;
  without it `sacct` fails with "accounting storage is disabled");
- slurmctld, then `slurmd -N localhost` for the one node `localhost` (NodeAddr 127.0.0.1), with
  `gpus_per_node` fake GPUs: character devices made with mknod in `folder/dev` (plain files are rejected),
  gres.conf `AutoDetect=off`, so `--gres=gpu:N` sets CUDA_VISIBLE_DEVICES as on a real node.
  With `nodes=N` (N > 1), N nodes `node1`..`nodeN` instead: one `slurmd -N nodeK` each on this machine, each
  with its own port and spool folder, all at NodeAddr 127.0.0.1 (their names resolve to nothing), so that
  multi-node jobs (`srun -N 2`) run for real.

Every config, state, spool and log file lives in `folder` (the configs written by harness/slurmconf.py, logs in
`folder/log`); every port is chosen free on 127.0.0.1. Nothing is written to /etc. `start` returns once `sinfo -h
-o %T` says `idle`. `stop` cancels the cluster's jobs, then ends what it started, by pid: its jobs and step daemons
(found by their SLURM_CONF, this cluster's own), slurmd, slurmctld, slurmdbd, MariaDB, munged.

What a test uses:

- `env`: the environment for Slurm's commands and for anything that runs them (a tfrund): os.environ plus
  SLURM_CONF=folder/slurm.conf and PATH with /usr/bin and /usr/sbin. Pass it as `env=` to subprocesses.
- `partition` ("debug", the default partition), `node` ("localhost"), `nodes` (the node names), `gpus_per_node`
  (2), `cpus`, `accounting` (True: `sacct` works), `cluster_name`, `conf` (the slurm.conf path), `folder`.
- `memory_mb=M`: the node has M MB and a job over its `--mem` is killed (harness/slurmconf.py says how).
- `run(cmd)`: a command (a list of arguments, or one string run by bash) with `env`; returns the
  CompletedProcess (text); `ok(cmd)` asserts it succeeded and returns its stdout.
- `sbatch(*args)` → the job id (`sbatch --parsable ARGS`); `squeue_state(id)` → Slurm's state while the job
  is in squeue, else None; `sacct(id)` → (State, ExitCode) of the job's allocation from accounting, e.g.
  ("FAILED", "3:0"), or None while accounting has no record; `wait_final(id)` → that pair once it is final.
- `versions()` → {"sbatch": (22, 5, 8), "sinfo": (22, 5, 8)}.

Facts about this setup (measured on a 2-core Debian 12 machine):

- A finished job stays in `squeue -t all` (state COMPLETED/FAILED/CANCELLED...) until MinJobAge has passed and
  slurmctld's purge, every 10 s or so, has run: with MinJobAge=2 (`slurmconf.MIN_JOB_AGE`) it leaves squeue 4 to 12 s
  after its end (measured). Plain `squeue` (no -t) hides finished jobs at once: an empty answer is no proof.
- `sacct` has no record of a job while it is pending (sbatch returns before the record reaches slurmdbd):
  absence from both squeue and sacct is not "gone" either. Once ended, sacct -X gives e.g. FAILED 3:0.
- A cancelled job's allocation reads State "CANCELLED by 0", ExitCode 0:0; its batch step CANCELLED 0:15.
- Bring-up with accounting: about 2.2 s (mariadb-install-db 0.7-1.4 s, slurmctld 1.1 s; `startup_seconds`).

The pytest fixture: `from harness.slurmcluster import slurm_fixture` in a test module gives its tests `slurm`, a
`SlurmCluster` shared by every module of the session that imports it (started once, stopped at the
session's end). Where Slurm is not installed, tests that use it are skipped, saying that .ci/run installs
it (the convention of tests/ for sshd, tmux and chromium).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Optional, Union

import pytest

from .home import Tfrun
from .processes import alive, wait_for
from .slurmconf import PATH, Shape, Unavailable, missing, write_config

FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
     "DEADLINE", "REVOKED"}
)  # fmt: skip


def _die_with_parent() -> None:
    """In a daemon's child before exec: SIGKILL it when the test process dies without stopping the cluster
    (Linux's PR_SET_PDEATHSIG). Its job steps are not covered: `stop` ends those."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _gone(pid: int) -> bool:
    return not alive(pid)


def _version(text: str) -> tuple[int, ...]:
    """(22, 5, 8) from "slurm 22.05.8" (also "slurm-wlm 22.05.8")."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        raise ValueError(f"no version in {text!r}")
    return tuple(int(part) for part in match.groups() if part is not None)


class SlurmCluster:
    """One single-node Slurm cluster whose files all live in `folder` (see the module's docstring)."""

    partition = "debug"
    node = "localhost"
    cluster_name = "tfci"

    def __init__(
        self,
        folder: Path,
        gpus_per_node: int = 2,
        accounting: bool = True,
        start: bool = True,
        memory_mb: Optional[int] = None,
        nodes: int = 1,
    ) -> None:
        absent = missing(accounting)
        if absent:
            raise Unavailable(f"Slurm is not installed here (missing: {', '.join(absent)}); .ci/run installs it")
        self.folder = folder.resolve()
        self.gpus_per_node = gpus_per_node
        self.accounting = accounting
        self.memory_mb = memory_mb
        # nodes > 1: node1..nodeN, each a slurmd of its own on this machine (its own port and spool), all at
        # 127.0.0.1; their names resolve to nothing, as on clusters whose node names are not hostnames.
        self.nodes = [self.node] if nodes == 1 else [f"node{index}" for index in range(1, nodes + 1)]
        self.cpus = os.cpu_count() or 1
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self.env = dict(os.environ)
        for name in [name for name in self.env if name.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_"))]:
            del self.env[name]  # e.g. a test session that itself runs inside a Slurm job
        self.env["SLURM_CONF"] = str(self.conf)
        self.env["PATH"] = PATH
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.startup_seconds: dict[str, float] = {}
        if start:
            self.start()

    # -- bring-up --------------------------------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.folder / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the child holds it)
        with log:
            proc = subprocess.Popen(
                command, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.folder, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self._procs[name] = proc
        return proc

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float = 30) -> None:
        proc = self._procs[name]

        def check() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self._tail(name)}")
            return ready()

        try:
            wait_for(check, timeout=timeout, what=f"{name} to be ready")
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{self._tail(name)}") from None

    def _tail(self, name: str) -> str:
        texts = []
        for path in sorted((self.folder / "log").glob(f"{name}*")):
            with contextlib.suppress(OSError):
                texts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(texts)

    def _listening(self, port: int) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def start(self) -> None:
        """Write the configs, start every daemon and return once the node is idle; on failure, stop what was
        started and raise RuntimeError with the daemons' logs."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _timed(self, step: str, began: float) -> float:
        now = time.monotonic()
        self.startup_seconds[step] = round(now - began, 2)
        return now

    def _start(self) -> None:
        began = t = time.monotonic()
        shape = Shape(self.nodes, self.cpus, self.gpus_per_node, self.memory_mb, self.accounting, self.cluster_name,
                      self.partition)  # fmt: skip
        self.ports = write_config(self.folder, shape)
        folder = self.folder
        munge = folder / "munge"
        self._spawn("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                               f"--seed-file={munge / 'munged.seed'}", f"--log-file={folder / 'log' / 'munged.log'}",
                               "--num-threads=2"])  # fmt: skip
        self._wait("munged", self.munge_socket.exists)
        t = self._timed("munged", t)
        if self.accounting:
            data = folder / "mariadb"
            install = subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db",
                 "--auth-root-authentication-method=normal", "--skip-name-resolve"],
                env=self.env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if install.returncode:
                raise RuntimeError(f"mariadb-install-db failed:\n{install.stdout}{install.stderr}")
            t = self._timed("mariadb-install-db", t)
            self._spawn("mariadbd", ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
                                     f"--socket={folder / 'run' / 'mysqld.sock'}", f"--port={self.ports.db}",
                                     "--bind-address=127.0.0.1", f"--pid-file={folder / 'run' / 'mariadbd.pid'}",
                                     f"--log-error={folder / 'log' / 'mariadbd.log'}", "--skip-grant-tables",
                                     "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
                                     "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                                     "--innodb-flush-method=nosync", "--innodb-log-file-size=16M"])  # fmt: skip
            self._wait("mariadbd", lambda: self._listening(self.ports.db))
            t = self._timed("mariadbd", t)
            self._spawn("slurmdbd", ["/usr/sbin/slurmdbd", "-D"])
            self._wait("slurmdbd", lambda: self._listening(self.ports.dbd))
            t = self._timed("slurmdbd", t)
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"])
        self._wait("slurmctld", lambda: self._listening(self.ports.ctld))
        t = self._timed("slurmctld", t)
        for name in self.nodes:
            self._spawn(self._slurmd(name), ["/usr/sbin/slurmd", "-D", "-N", name])
        for name in self.nodes:
            self._wait(self._slurmd(name), functools.partial(self._idle, name))
        t = self._timed("slurmd-idle", t)
        self.startup_seconds["total"] = round(t - began, 2)

    def _slurmd(self, node: str) -> str:
        """The name a node's slurmd is kept under (its log file's too): `slurmd` for the single node."""
        return "slurmd" if len(self.nodes) == 1 else f"slurmd-{node}"

    def _idle(self, node: str) -> bool:
        result = self.run(["sinfo", "-h", "-o", "%T", "-n", node], timeout=10)
        return result.returncode == 0 and result.stdout.strip() == "idle"

    # -- commands --------------------------------------------------------------------------------------------

    def run(self, cmd: Union[str, Sequence[str]], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`cmd` (arguments, or one string for bash) with this cluster's `env`; never raises on its status."""
        args = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)

    def ok(self, cmd: Union[str, Sequence[str]], timeout: float = 60) -> str:
        """`run(cmd)`, asserting it succeeded; its stdout."""
        result = self.run(cmd, timeout=timeout)
        assert result.returncode == 0, f"{cmd} -> {result.returncode}\n{result.stdout}{result.stderr}"
        return result.stdout

    def sbatch(self, *args: str) -> int:
        """`sbatch --parsable ARGS`: the job id."""
        return int(self.ok(["sbatch", "--parsable", *args]).strip().split(";")[0])

    def squeue_state(self, job_id: int) -> Optional[str]:
        """The job's state while squeue still lists it (finished ones included, -t all), else None."""
        result = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"])
        state = result.stdout.strip()
        return state or None

    def sacct(self, job_id: int) -> Optional[tuple[str, str]]:
        """(State, ExitCode) of the job's allocation (not its steps) from accounting, or None while it has no
        record. A cancelled job's State is e.g. "CANCELLED by 0": only the first word is kept."""
        out = self.ok(["sacct", "-j", str(job_id), "-n", "-P", "-X", "-o", "JobID,State,ExitCode"])
        for line in out.splitlines():
            jid, state, code = line.split("|")
            if jid == str(job_id):
                return state.split()[0], code
        return None

    def wait_final(self, job_id: int, timeout: float = 60) -> tuple[str, str]:
        """(State, ExitCode) from sacct once the job is in a final state."""

        def final() -> Optional[tuple[str, str]]:
            found = self.sacct(job_id)
            return found if found and found[0] in FINAL_STATES else None

        return wait_for(final, timeout=timeout, what=f"job {job_id} to end")  # type: ignore[no-any-return]

    def versions(self) -> dict[str, tuple[int, ...]]:
        """Versions of the client commands, as tfrund would detect them: {"sbatch": (22, 5, 8), ...}."""
        return {cmd: _version(self.ok([cmd, "--version"])) for cmd in ("sbatch", "sinfo", "squeue", "sacct")}

    # -- teardown --------------------------------------------------------------------------------------------

    def _processes(self) -> list[int]:
        """Pids of processes (jobs, slurmstepd) that carry this cluster's SLURM_CONF, other than this one."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
        return found

    def stop(self) -> None:
        """Cancel the jobs, then end every process this cluster started, by pid (daemons in reverse order of
        starting: slurmd, slurmctld, slurmdbd, mariadbd, munged). Safe to call twice."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.run(["scancel", "--full", "--quiet", "-u", "root"], timeout=10)
        for name in reversed(list(self._procs)):
            proc = self._procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            if name.startswith("slurmd") and name != "slurmdbd":  # its step daemons and their jobs outlive it
                for pid in self._processes():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in self._processes():
            wait_for(functools.partial(_gone, pid), timeout=10, what=f"process {pid} of the cluster to end")
        self._procs.clear()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def use_cluster(tf: Tfrun, cluster: SlurmCluster, checkpoints: Optional[Path] = None, options: str = "") -> Tfrun:
    """`tf` with a tfrund (started on demand by its client) that submits to `cluster`: executor = "slurm", its
    partition, a 10-minute time limit, `options` added to [slurm], checkpoints under `checkpoints` if given, and
    Slurm's commands on the PATH."""
    tf.home.mkdir(parents=True, exist_ok=True)
    root = f'checkpoint_root = "{checkpoints}"\n' if checkpoints else ""
    (tf.home / "config.toml").write_text(
        f'executor = "slurm"\n{root}[slurm]\npartition = "{cluster.partition}"\ntime = "10"\n{options}'
    )
    tf.env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    tf.env["PATH"] = f"{tf.env.get('PATH', '')}:{cluster.env['PATH']}"
    return tf


def slurm_id_of(tf: Tfrun, job: int) -> str:
    """The Slurm id of tfrun job `job` (its slurm.json), once sbatch gave one."""
    record = wait_for(lambda: json.loads((tf.job_dir(job) / "slurm.json").read_text() or "{}"), what="slurm.json")
    return str(record["slurm_id"])


@pytest.fixture(name="on_slurm")
def on_slurm_fixture(tf: Tfrun, slurm: SlurmCluster) -> Tfrun:
    """The test's tfrun, its daemon submitting to the session's cluster (`use_cluster`)."""
    return use_cluster(tf, slurm)


_shared: Optional[SlurmCluster] = None
_users = 0


@pytest.fixture(scope="session", name="slurm")
def slurm_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The session's Slurm cluster, with accounting and 2 fake GPUs: one for every module that imports this
    fixture (each import is a fixture of its own to pytest; they share the cluster, stopped by the last).
    Skipped, naming .ci/run, where Slurm is not installed; its folder is removed after a clean stop."""
    global _shared, _users
    if _shared is None:
        try:
            _shared = SlurmCluster(tmp_path_factory.mktemp("slurm"))
        except Unavailable as exc:
            pytest.skip(str(exc))
    _users += 1
    try:
        yield _shared
    finally:
        _users -= 1
        if _users == 0 and _shared is not None:
            cluster, _shared = _shared, None
            cluster.stop()
            shutil.rmtree(cluster.folder, ignore_errors=True)


if (
    __name__ == "__main__"
):  # a cluster by hand, from the checkout: python -m tests.harness.slurmcluster [FOLDER]; Ctrl-C stops it
    import sys
    import tempfile

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped cleanly by kill PID too
    with SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="slurm-"))) as cluster:
        print(f"up in {cluster.startup_seconds['total']} s; in another shell: export SLURM_CONF={cluster.conf}")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
