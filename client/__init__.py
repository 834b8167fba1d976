"""tfrun, the client: the CLI and the ways it reaches a daemon (today: the local one, on its Unix socket)."""
