"""tfrund, the daemon on the box: it runs jobs through shims, records them in SQLite, serves the protocol.

Its parts stand on floors, each importing only the floors below it (tests/test_codebase.py holds the order);
read them from the ground up, each package's docstring first:

1. faults.py, home.py: the tests' crash points; the daemon's home, its lock, what every process it starts gets
2. shim/: what runs beside each job (the shim, the job folder's files, GPU leases, the log index), stdlib only
3. logs/: a job's log as clients read it (streams, filters, file events)
4. records/: the job record and its moves (store, schema, lifecycle), and how a job ended (an OOM)
5. metrics/: metrics read from a job's output, kept, explained, written for TensorBoard
6. gpus/: the box's GPUs through NVML, each job's GPU use over its life, the leases a pass claims
7. alerts/: rules, loss spikes, the watch over each job, messages, the outbox
8. workdir/: the content store a job's snapshot is built from, its checkpoint folder
9. storage/: checkpoints copied to object storage once complete, and restored on another box
10. executors/: where jobs run (a shim each here, or Slurm) and Runs, which starts them
11. services/: what TensorBoard and Jupyter run
12. queue/: which queued job starts when
13. doctor.py: is this box ready to train
14. config/: the daemon's configuration, read and while it runs
15. limits.py, housekeeping.py: the box's limits at start; removing ended jobs, collecting unused contents
16. handlers/: one module per slice of the protocol
17. daemon.py: the main loop
18. cli.py: `tfrund`
19. __main__.py: `python -m tfrun.runner`

Kept free of code on purpose: the shim (`python -m tfrun.runner.shim`) is started once per job and must stay
cheap, and importing it imports this package first.
"""
