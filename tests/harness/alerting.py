"""What the alert tests share: a daemon configured to send to the test's receivers, the alerts it stored, and jobs
that print what a test gives them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .home import Tfrun
from .processes import wait_for
from .receivers import no_internet

# Real messages, as the frameworks print them (TensorFlow's come from a live TF job below).
PYTORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process has 20.52 GiB memory in use."
)


def configure(tf: Tfrun, *urls: str, alerts: str = "") -> None:
    """The daemon's config.toml, written before the first command starts the daemon."""
    tf.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    tf.home.chmod(0o700)
    (tf.home / "config.toml").write_text(f"notify = {json.dumps(list(urls))}\n[alerts]\n{alerts}")
    no_internet(tf.env)


def alerts_of(tf: Tfrun, job: int | None = None) -> list[dict[str, Any]]:
    return json.loads(tf.ok("alerts", "--json", *([str(job)] if job is not None else [])))  # type: ignore[no-any-return]


def settled(tf: Tfrun, job: int, rules: int) -> list[dict[str, Any]]:
    """The job's alerts once it has ended and `rules` of them are stored, and a little longer: a second copy
    of anything would have been stored by then."""
    tf.run("wait", str(job))
    wait_for(lambda: len(alerts_of(tf, job)) >= rules, what=f"{rules} alert(s) of job {job}")
    time.sleep(1.0)
    return alerts_of(tf, job)


def printing(*lines: str, code: int = 0) -> str:
    return "import sys, time\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines) + f"sys.exit({code})\n"
