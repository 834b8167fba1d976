"""tfrun: run training jobs on a GPU box that outlive the client, the SSH link and the daemon itself.

This package is the shared core: the wire protocol (`tfrun.protocol`), the constants both sides agree on
(`tfrun.constants`) and where a daemon's files live (`tfrun.paths`). The client (`tfrun.client`), the
daemon (`tfrun.runner`) and the code that runs inside a training process (`tfrun.jobs`) live beside it.

Keep this module free of imports: `tfrun.jobs` is importable in every job's interpreter (Python 3.8 and
newer, with only the standard library), and importing it imports this file first.
"""

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing's, without importing typing: type checkers take the block below as run
if TYPE_CHECKING:  # the API's names as types (`def f(c: tfrun.Client)`), which __getattr__ alone cannot give
    from tfrun.client.calls import Call
    from tfrun.client.errors import TfrunError
    from tfrun.client.library.api import Client, JobHandle
    from tfrun.client.library.asyncclient import AsyncClient, NoSuchJob
    from tfrun.protocol.channel import RemoteError
    from tfrun.protocol.logs import LogQuery
    from tfrun.protocol.submit import JobOptions
    from tfrun.protocol.wire import ProtocolError

    __all__ = ["AsyncClient", "Call", "Client", "JobHandle", "JobOptions", "LogQuery", "NoSuchJob"]
    __all__ += ["ProtocolError", "RemoteError", "TfrunError"]

# The Python API (client/library/api.py, its async core in client/library/asyncclient.py), imported on first use only: a
# training process imports this package too.
_API = {
    "Client": "tfrun.client.library.api",
    "AsyncClient": "tfrun.client.library.asyncclient",
    "JobHandle": "tfrun.client.library.api",
    "NoSuchJob": "tfrun.client.library.asyncclient",
    "JobOptions": "tfrun.protocol.submit",
    "Call": "tfrun.client.calls",
    "LogQuery": "tfrun.protocol.logs",
    "TfrunError": "tfrun.client.errors",
    "RemoteError": "tfrun.protocol.channel",
    "ProtocolError": "tfrun.protocol.wire",
}


def __getattr__(name: str) -> type:
    """`tfrun.Client` and the API's other names (all classes), imported when first asked for (PEP 562)."""
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tfrun' has no attribute {name!r}")
    import importlib

    found: type = getattr(importlib.import_module(module), name)
    return found
