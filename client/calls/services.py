"""Calls that start a service on the box (tfrun/protocol/services.py): TensorBoard and Jupyter."""

from __future__ import annotations

import re
from typing import Optional

from tfrun.constants import EXIT_DAEMON
from tfrun.protocol.services import CheckService, ServiceReply, StartService

from ..errors import TfrunError
from . import Call, whole

# A URL's path and query as a service names them (`/`, `/lab?token=...`): RFC 3986's characters, less those that
# could end an HTML attribute or a script (quotes, <, >, backslash, spaces), which no service of tfrun's sends.
_PATH = re.compile(r"/[A-Za-z0-9._~!$&()*+,;=:@%/?-]*")


def tensorboard(jobs: list[str], since: float) -> Call[ServiceReply, ServiceReply]:
    """TensorBoard over the jobs' folders (none: every job of the last `since` s); the one running already, if
    it shows the same."""
    return Call(StartService(kind="tensorboard", jobs=jobs, since=since), _plain_path)


def jupyter(root_dir: Optional[str] = None, gpus: int = 0) -> Call[ServiceReply, ServiceReply]:
    """JupyterLab in `root_dir` (None: the home folder) with `gpus` GPUs of its own."""
    return Call(StartService(kind="jupyter", root_dir=root_dir, gpus=gpus), _plain_path)


def check(job: int) -> Call[ServiceReply, ServiceReply]:
    """Service `job`, if it still serves its port (its own processes listen there); refused, saying why, if not."""
    return Call(CheckService(job=str(job)), whole)


def _plain_path(reply: ServiceReply) -> ServiceReply:
    """The reply, if the path it names is a plain URL path: it goes into a page the browser opens and onto the
    terminal, so nothing a daemon sends there may be markup or a terminal's control sequence."""
    if not _PATH.fullmatch(reply.path):
        raise TfrunError(f"tfrund answered with a service path tfrun does not open: {reply.path[:80]!r}", EXIT_DAEMON)
    return reply
