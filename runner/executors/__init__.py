"""Where jobs run: the Executor interface (executor.py) and LocalExecutor, a shim per job on this machine (local.py),
Slurm (slurm/), `--tty` jobs in tmux (ttyjob.py), and Runs (runs.py), which starts jobs through the executor and
makes lifecycle moves of what it sees. The shim itself is runner/shim/.

Stands on: records, shim, faults, home (the environment every process begins with).
"""
