"""Slurm as an executor (issue 19): jobs submitted with sbatch, each under tfrun's own shim in its batch
script. `executor.py` is the Executor; `commands.py` runs Slurm's commands and knows its version;
`states.py` maps Slurm's states to tfrun's; `settings.py` is config.toml's [slurm] table.
"""
