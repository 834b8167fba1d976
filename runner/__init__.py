"""tfrund, the daemon on the box: it runs jobs through shims, records them in SQLite, serves the protocol.

Its wings, each a package whose docstring says what it owns and which wings it may touch (tests/test_codebase.py
holds each to it):

- records/: the job record and its moves (store, schema, job, jobdir, jobfiles, lifecycle);
- queue/: which queued job starts when (scheduler, GPU leases);
- executors/: where jobs run (LocalExecutor, Slurm, the shim, Runs);
- logs/: a job's log as clients read it (streams, filters, index, file events);
- alerts/: rules, OOM text, loss spikes, the watch, messages, the outbox;
- metrics/: metrics read from a job's output, kept, explained, written for TensorBoard;
- box/: config, doctor, GPUs, the content store, checkpoints, housekeeping;
- services/: what TensorBoard and Jupyter run.

Above them, the daemon itself: daemon.py (its main loop), handlers/ (one module per slice of the protocol),
cli.py (`tfrund`), faults.py (the tests' crash points) and shim.py (the shim's entry point).

Kept free of code on purpose: the shim (`tfrun.runner.shim`) is started once per job and must stay cheap, and
importing it imports this package first.
"""
