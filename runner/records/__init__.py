"""The job record and its moves: a job's spec and row (job.py), the store (store.py: one SQLite database per
daemon, schema.py its migrations), a job's files as `tfrun pull` reaches them (jobfiles.py), how a job ended
(oom.py: the OOM killer's count, OOM text in the log), and the lifecycle (lifecycle.py), the only code that
changes a job's state and decides the cause of an ending: every move in one table, one transaction each.

Stands on: logs (terminal lines), shim (the job's folder), faults. Every wing above reads and moves jobs
through this one.
"""
