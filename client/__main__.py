"""`python -m tfrun.client` is `tfrun`."""

from .cli.main import main

main()
