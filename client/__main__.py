"""`python -m tfrun.client` is `tfrun`."""

from .cli import main

main()
