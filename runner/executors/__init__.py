"""Where jobs run: the Executor interface (executor.py) and LocalExecutor, a shim per job on this machine (local.py),
Slurm (slurm/), the shim itself (shim.py; `python -m tfrun.runner.shim` is its entry), a process told apart
from a later one with its pid (process.py), the OOM killer's count (cgroup.py), `--tty` jobs in tmux (ttyjob.py),
and Runs (runs.py), which starts jobs through the executor and makes lifecycle moves of what it sees.

May touch: records, alerts (oom), box (config), logs (the log index), queue (GPU leases), faults. The shim
and what it imports (jobdir, process, cgroup, gpulease, logindex) use the standard library alone.
"""
