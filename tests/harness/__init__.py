"""The tests' real parts, shared by tests/ and bench/: a tfrun of the test's own (`home`), a real sshd
(`sshd`), processes as /proc shows them (`processes`), alert receivers (`receivers`), and in modules of their
own, imported by the tests that need them: a Slurm cluster (`slurmcluster`), network namespaces (`netns`), a
second Unix user (`otheruser`), a relay that freezes connections (`relay`), boxes for pool tests
(`fleetbox`).

The tests import it as `harness` (pytest puts tests/ on the path); bench/'s scripts, run from the checkout
as `python -m bench.NAME`, as `tests.harness`. So its modules import each other relatively.
"""

from .home import TFRUN, TFRUND, Tfrun, gated_job, keepers_of, write_script
from .processes import (
    alive,
    connected,
    free_port,
    keeper_socket,
    kill_and_await_successor,
    open_fds,
    own_sockets,
    processes_of,
    serving_daemon,
    sockets,
    wait_for,
)
from .receivers import Mailbox, Receiver, no_internet
from .sshd import Sshd, box_sshd, local_and_ssh, remote_client

__all__ = [
    "TFRUN",
    "TFRUND",
    "Mailbox",
    "Receiver",
    "Sshd",
    "Tfrun",
    "alive",
    "box_sshd",
    "connected",
    "free_port",
    "gated_job",
    "keeper_socket",
    "keepers_of",
    "kill_and_await_successor",
    "local_and_ssh",
    "no_internet",
    "open_fds",
    "own_sockets",
    "processes_of",
    "remote_client",
    "serving_daemon",
    "sockets",
    "wait_for",
    "write_script",
]
