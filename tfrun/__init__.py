"""tfrun: run training jobs on a GPU box that outlive the client, the SSH link and the daemon itself.

This package is the shared core: the wire protocol (`tfrun.protocol`), the constants both sides agree on
(`tfrun.constants`) and where a daemon's files live (`tfrun.paths`). The client (`tfrun.client`), the
daemon (`tfrun.runner`) and the code that runs inside a training process (`tfrun.jobs`) live beside it.

Keep this module free of imports: `tfrun.jobs` is importable in every job's interpreter (Python 3.8 and
newer, with only the standard library), and importing it imports this file first.
"""

__version__ = "0.1.0"
