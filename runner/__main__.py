"""`python -m tfrun.runner` is `tfrund`: the client starts the local daemon this way, with its own Python."""

from .cli import main

main()
