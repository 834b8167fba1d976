"""The shim: what runs beside each job, outside the daemon, on the standard library alone (the shim starts once
per job and must stay cheap; a Slurm node runs it with the daemon's Python and `-S`).

supervise.py is the shim itself (`python -m tfrun.runner.shim JOB_DIR`, __main__.py): it starts the job, owns
the cancel grace and records the end. jobdir.py is its contract with the daemon, as files of the job's folder;
process.py tells a process apart from a later one with its pid; cgroup.py reads the OOM killer's count;
gpulease.py holds the box-wide GPU leases; logindex.py keeps the log's (offset, time) index; slurmtask.py runs a
job across Slurm nodes (by its path, beside the user's job).

Stands on: nothing of runner/ (tfrun's constants and numerals alone).
"""
