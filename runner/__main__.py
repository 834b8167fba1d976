"""`python -m tfrun.runner` is `tfrund`: the client starts the local daemon this way, with its own Python."""

from tfrun.runner.cli import main

main()
