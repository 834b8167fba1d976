"""`python -m tfrun.runner.shim JOB_DIR`: the shim's entry point (the shim is runner/shim/supervise.py).

Kept at this path because every launcher names it: batch scripts that an earlier tfrund queued in Slurm
run `-m tfrun.runner.shim` when their job starts, days later perhaps.
"""

import sys

from .supervise import main

if __name__ == "__main__":
    main(sys.argv)
