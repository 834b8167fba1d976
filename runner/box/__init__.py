"""The box the daemon runs on: its config (config.py) and that config while the daemon runs (liveconfig.py),
`doctor` (doctor.py), the GPUs through NVML (gpus.py), the content store and the snapshots built from it
(blobs.py), each job's checkpoint folder (checkpoints.py), and housekeeping (housekeeping.py: removing ended
jobs, collecting contents no job needs).

May touch: records, alerts (rules, receivers; the live config reaches the watch), metrics (patterns), queue
(GPU leases; the live config reaches the scheduler), executors (Slurm's settings and arrays).
"""
