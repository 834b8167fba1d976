"""The daemon's configuration: config.toml read and checked (settings.py), and that config while the daemon runs
(live.py: `tfrund config set`, a reload, and what each change reaches now).

Each wing below takes the settings it needs, named in its own terms (alerts/rules.py's AlertConfig,
queue/scheduler.py's QueueConfig, executors/slurm/settings.py's SlurmSettings): this wing builds them.

Stands on: alerts, metrics (patterns), executors (Slurm's settings), queue (the live config reaches the
scheduler), workdir, doctor.
"""
