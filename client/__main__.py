"""`python -m tfrun.client` is `tfrun`."""

from tfrun.client.cli import main

main()
