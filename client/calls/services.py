"""Calls that start a service on the box (tfrun/protocol/services.py): TensorBoard and Jupyter."""

from __future__ import annotations

from typing import Optional

from tfrun.client.calls import Call, whole
from tfrun.protocol.services import CheckService, ServiceReply, StartService


def tensorboard(jobs: list[str], since: float) -> Call[ServiceReply, ServiceReply]:
    """TensorBoard over the jobs' folders (none: every job of the last `since` s); the one running already, if
    it shows the same."""
    return Call(StartService(kind="tensorboard", jobs=jobs, since=since), whole)


def jupyter(root_dir: Optional[str] = None, gpus: int = 0) -> Call[ServiceReply, ServiceReply]:
    """JupyterLab in `root_dir` (None: the home folder) with `gpus` GPUs of its own."""
    return Call(StartService(kind="jupyter", root_dir=root_dir, gpus=gpus), whole)


def check(job: int) -> Call[ServiceReply, ServiceReply]:
    """Service `job`, if it still serves its port (its own processes listen there); refused, saying why, if not."""
    return Call(CheckService(job=str(job)), whole)
