"""What a test's Slurm cluster needs (harness/slurmcluster.py starts it): Debian's programs, and the files it reads
(slurm.conf, gres.conf and slurmdbd.conf, a munge key, fake GPUs), all in the cluster's folder, on ports of
127.0.0.1 chosen free.

The settings that make a cluster quick to test on: MinJobAge=2 (`MIN_JOB_AGE`) lets a finished job leave squeue 4 to
12 s after its end; AuthInfo cred_expire=10 and SchedulerParameters bf_interval=1,sched_interval=2 run a requeued job
again in about 12 s instead of 2 minutes; MpiParams=ports gives `srun --resv-ports=N` 10 free ports (a bare
`--resv-ports`, no count, reserves none on 22.05).

With `memory_mb=M` the node has M MB (RealMemory), memory is a consumable resource (CR_Core_Memory) and a job over
its `--mem` is killed (JobAcctGatherParams=OverMemoryKill, sampled every second): with TaskPlugin=task/none there are
no cgroups, so Slurm's state is FAILED (ExitCode 0:9, Reason JobLaunchFailure) and slurmstepd writes "StepId=N.batch
exceeded memory limit (...), being killed" and "Exceeded job memory limit" to the job's output. With CR_Core alone,
`--mem` is not enforced at all.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# The programs a cluster needs: Debian's slurm-wlm slurmctld slurmd munge slurm-client (+ mariadb-server slurmdbd
# for accounting), which .ci/run installs.
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
COMMANDS = ("sbatch", "squeue", "sinfo", "scancel", "srun", "sacct", "scontrol")
ACCOUNTING = ("/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/sbin/slurmdbd", "/usr/bin/sacctmgr")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIN_JOB_AGE = 2  # seconds a finished job stays before the purge may take it out of squeue


class Unavailable(Exception):
    """Slurm (or, for accounting, MariaDB and slurmdbd) is not installed here."""


def missing(accounting: bool = True) -> list[str]:
    """The programs a cluster needs that are not installed; empty when it can start."""
    needed = [*DAEMONS, *(shutil.which(c, path=PATH) or c for c in COMMANDS)]
    if accounting:
        needed += ACCOUNTING
    return [program for program in needed if not os.access(program, os.X_OK)]


@dataclass(frozen=True)
class Shape:
    """What a cluster is made of: its nodes (names), each with `cpus`, `gpus_per_node` fake GPUs and, given
    `memory_mb`, that much memory enforced per job; accounting (slurmdbd) or none."""

    nodes: list[str]
    cpus: int
    gpus_per_node: int
    memory_mb: Optional[int]
    accounting: bool
    cluster_name: str
    partition: str


@dataclass(frozen=True)
class Ports:
    """The ports of 127.0.0.1 a cluster's daemons listen on; `mpi` is the first of 10 for srun --resv-ports."""

    ctld: int
    slurmd: int
    dbd: int
    db: int
    mpi: int


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (held open together while chosen, so no two are equal)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_block(size: int) -> int:
    """The first port of `size` consecutive ports free on 127.0.0.1 (for MpiParams=ports, srun --resv-ports)."""
    for _ in range(200):
        first = 20000 + secrets.randbelow(20000)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + size):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
    raise RuntimeError(f"no {size} consecutive free ports on 127.0.0.1")


def write_config(folder: Path, shape: Shape) -> Ports:
    """Every file a cluster of `shape` reads, in `folder` (slurm.conf, gres.conf, slurmdbd.conf, the munge key, the
    fake GPUs), on ports chosen free now; the ports it chose."""
    for sub in ("munge", "log", "state", "spool", "dev", "tmp", "run"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    chosen = free_ports(4 + len(shape.nodes))
    ports, node_ports = Ports(chosen[0], chosen[1], chosen[2], chosen[3], port_block(10)), chosen[4:]
    munge_socket = folder / "munge" / "munge.socket"
    key = folder / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    gpus = []
    for index in range(shape.gpus_per_node):
        device = folder / "dev" / f"gpu{index}"
        if not device.exists():
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device (/dev/null's numbers)
        gpus.append(device)
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_socket},cred_expire=10\n"
    accounting = (
        f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={ports.dbd}\nAccountingStorageTRES=gres/gpu\n"
        f"AccountingStoragePass={munge_socket}\n"  # the munge socket for talking to slurmdbd
        if shape.accounting
        else "AccountingStorageType=accounting_storage/none\n"
    )
    gres = f"Gres=gpu:{shape.gpus_per_node}" if shape.gpus_per_node else ""
    # memory_mb: the node's memory, and a job over its --mem killed by slurmstepd (sampled each second; no
    # cgroups here, so Slurm says FAILED, not OUT_OF_MEMORY); memory is then a resource each job asks for
    memory = f"RealMemory={shape.memory_mb}" if shape.memory_mb else ""
    select = "CR_Core_Memory" if shape.memory_mb else "CR_Core"  # a job's --mem is its step's limit
    gather = (
        "JobAcctGatherFrequency=1\nJobAcctGatherParams=OverMemoryKill"
        if shape.memory_mb
        else "JobAcctGatherFrequency=5"
    )
    slurmd_port = f"SlurmdPort={ports.slurmd}\n"  # several nodes: a Port= each, on its NodeName line
    if len(shape.nodes) == 1:
        node_lines = f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={shape.cpus} {memory} {gres} State=UNKNOWN\n"
    else:
        node_lines = "".join(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={shape.cpus} {memory} "
            f"{gres} State=UNKNOWN\n"
            for name, port in zip(shape.nodes, node_ports)
        )
        slurmd_port = ""
        for name in shape.nodes:
            (folder / "spool" / name).mkdir(exist_ok=True)
    node_list = ",".join(shape.nodes)
    (folder / "slurm.conf").write_text(
        f"""# A single-node cluster for tfrun's tests (tests/harness/slurmcluster.py).
ClusterName={shape.cluster_name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports.ctld}
{slurmd_port}SlurmUser=root
SlurmdUser=root
{auth}CryptoType=crypto/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool{"/%n" if len(shape.nodes) > 1 else ""}
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS={folder}/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
MpiParams=ports={ports.mpi}-{ports.mpi + 9}
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters={select}
ReturnToService=2
MinJobAge={MIN_JOB_AGE}
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=30
GresTypes=gpu
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
{gather}
{accounting}{node_lines}PartitionName={shape.partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""
    )
    device_list = ",".join(str(gpu) for gpu in gpus)
    (folder / "gres.conf").write_text(
        "AutoDetect=off\n" + (f"NodeName={','.join(shape.nodes)} Name=gpu File={device_list}\n" if gpus else "")
    )
    if shape.accounting:
        dbd = folder / "slurmdbd.conf"
        dbd.write_text(
            f"""{auth}DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports.dbd}
SlurmUser=root
PidFile={folder}/run/slurmdbd.pid
LogFile={folder}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports.db}
StorageUser=root
StorageLoc=slurm_acct_db
"""
        )
        dbd.chmod(0o600)  # slurmdbd refuses a config others may read
    return ports
