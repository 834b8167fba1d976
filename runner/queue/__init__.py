"""Which queued job starts when: the scheduler (scheduler.py: priorities, `--after`, a work dir built from
the snapshot, GPUs of its own for each job, through the leases of runner/gpus/claims.py) and what it asks the
store (queries.py).

Stands on: executors (the Runs it is given), gpus, workdir, records, faults. Its settings: QueueConfig.
"""
