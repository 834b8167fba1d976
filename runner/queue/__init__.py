"""Which queued job starts when: the scheduler (scheduler.py: priorities, `--after`, a work dir built from
the snapshot, GPUs of its own for each job), the box-wide GPU leases (gpulease.py) that keep two daemons, of
one user or two, off one GPU, and the leases a pass claims for the jobs it starts (claims.py).

May touch: records, box, executors (the Runs it is given), faults.
"""
