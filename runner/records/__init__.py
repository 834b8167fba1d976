"""The job record and its moves: a job's spec and row (job.py), the store (store.py: one SQLite database per
daemon, schema.py its migrations), the files of a job's folder that the daemon and the shim pass each other
(jobdir.py), a job's files as `tfrun pull` reaches them (jobfiles.py), and the lifecycle (lifecycle.py), the only
code that changes a job's state: every move in one table, one transaction each.

May touch: alerts (oom: an end's reason), faults. Every other wing reads and moves jobs through this one.
"""
