"""tfrun, the client: the CLI (`cli.py`, `verbs/`), the library it stands on (`api.py`, `asyncclient.py`) and the ways
it reaches a daemon: this machine's on its Unix socket (`connection.py`), a box's over SSH (`ssh.py`, `keeper.py`)."""
