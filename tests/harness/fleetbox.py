"""The shared fleet of tests/test_fleet.py and tests/test_fleet_views.py: three boxes, each a real sshd with a
daemon of its own (its TFRUN_HOME, one fake GPU: TFRUN_GPUS=0), all three in one client config and pool `gpu`.
A test module gets the fixtures `fleet` and `jobs_ended` by importing `fleet_fixture` and `jobs_ended_fixture`;
`fleet` is module-scoped, so each such module has boxes of its own.

Two layouts, chosen by parametrizing `fleet` (indirect) with "direct" (also what an unparametrized test gets)
or "jump":

- direct: the three sshd listen on 127.0.0.1 of the test's own network namespace (the machine's).
- jump (issue 18): network namespaces of the fleet's own (tests/harness/netns.py). box1's and box2's sshd listen on
  127.0.0.1 of the client's namespace, where every tfrun command of the fleet runs (`Tfrun.prefix`); box3's
  sshd is in a box namespace that only the bastion's namespace is linked to, with no routing or forwarding:
  from the client, box3 is reachable only through a fourth sshd, the bastion's, named by `hosts add box3
  ... --jump`. Each daemon is started through SSH, so it and its jobs run in its box's namespace. Where no
  namespace may be made (not root), the jump layout is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from .home import TFRUN, Tfrun, write_script
from .netns import Namespace, Network, Unavailable
from .processes import wait_for
from .sshd import Sshd

BOXES = ("box1", "box2", "box3")
JUMPED = "box3"  # the box behind the bastion in the jump layout


@dataclass
class Fleet:
    client: Tfrun
    sshd: dict[str, Sshd]
    homes: dict[str, Path]
    script: str  # a job that prints its argument, then waits until gates/ARG exists
    gates: Path
    jumped: Optional[str] = None  # the box reachable only through `bastion` (the jump layout), else None
    bastion: Optional[Sshd] = None  # the jump host's sshd, in a namespace of its own (the jump layout)
    namespaces: dict[str, Namespace] = field(default_factory=dict)  # the jump layout: "client", then each box's

    def destination(self, name: str) -> str:
        """USER@ADDRESS:PORT of box `name`'s sshd, as `hosts add` takes it."""
        return f"{getpass.getuser()}@{self.sshd[name].address}:{self.sshd[name].port}"

    @property
    def jump(self) -> Optional[str]:
        """The bastion as `hosts add --jump` takes it; None in the direct layout."""
        return f"{getpass.getuser()}@{self.bastion.address}:{self.bastion.port}" if self.bastion else None

    def add(
        self, name: str, destination: str, pools: list[str], home: Path, key: Path, jump: Optional[str] = None
    ) -> None:
        """Write host `name` into the client's config, as `hosts add` would, through it."""
        self.client.ok("hosts", "add", name, destination, "--identity-file", str(key),
                       "--tfrund", shlex.join([sys.executable, "-m", "tfrun.runner"]),
                       "--env", f"TFRUN_HOME={home}", "--env", "TFRUN_GPUS=0",
                       *(arg for pool in pools for arg in ("--pool", pool)),
                       *(("--jump", jump) if jump else ()))  # fmt: skip

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.client.run("submit", *args)
        assert result.returncode == 0, result.stderr
        return result

    def popen(self, *args: str, **kw: Any) -> subprocess.Popen[str]:
        """`tfrun ARGS` started and left running, where the client's commands run (its namespace, if any)."""
        return subprocess.Popen([*self.client.prefix, *TFRUN, *args], env=self.client.env, text=True, **kw)

    def running(self, address: str) -> None:
        wait_for(lambda: json.loads(self.client.ok("status", "--json", address))["state"] == "running",
                 what=f"{address} to run")  # fmt: skip


@pytest.fixture(scope="module", name="fleet")
def fleet_fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The fleet, in the layout the test's parameter names ("direct" when none); everything it started is
    stopped at the end, whatever happened: daemons and their jobs, keepers, sshd, namespaces and veths."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    layout = getattr(request, "param", "direct")
    assert layout in ("direct", "jump"), layout
    root = tmp_path_factory.mktemp(f"fleet-{layout}")
    # Leaving: box daemons, then the client's keepers, then each sshd, then the namespaces (LIFO).
    with contextlib.ExitStack() as stop:
        namespaces: dict[str, Namespace] = {}
        where: dict[str, tuple[str, Optional[str]]] = {name: ("127.0.0.1", None) for name in BOXES}  # address, netns
        bastion: Optional[Sshd] = None
        if layout == "jump":
            net = stop.enter_context(Network("fleet"))
            try:
                client_ns, jump_ns, box_ns = net.namespace("client"), net.namespace("jump"), net.namespace("box")
            except Unavailable as exc:
                pytest.skip(f"the jump layout needs network namespaces: {exc}")
            _, jump_address = net.link(client_ns, jump_ns)
            _, box_address = net.link(jump_ns, box_ns)
            namespaces = {"client": client_ns, "box1": client_ns, "box2": client_ns, JUMPED: box_ns}
            where = {name: ("127.0.0.1", client_ns.name) for name in BOXES}
            where[JUMPED] = (box_address, box_ns.name)
            bastion = Sshd(root / "sshd-bastion", address=jump_address, netns=jump_ns.name)
            stop.callback(bastion.stop, sessions=True)
        servers = {}
        for name in BOXES:
            address, netns = where[name]
            servers[name] = Sshd(root / f"sshd-{name}", address=address, netns=netns)
            stop.callback(servers[name].stop, sessions=True)
        prefix = namespaces["client"].exec if namespaces else None
        client = Tfrun(root / "client-state", prefix=prefix, client_home=root / "client-home")
        stop.callback(client.cleanup)  # the keepers: they carry the client's TFRUN_HOME
        homes = {name: root / f"home-{name}" for name in BOXES}
        for home in homes.values():
            stop.callback(Tfrun(home).cleanup)
        ssh_dir = client.client_home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        hosts = [*servers.values(), *([bastion] if bastion else [])]
        (ssh_dir / "known_hosts").write_text("".join(server.known_hosts_line for server in hosts))
        gates = root / "gates"
        gates.mkdir()
        project = root / "project"
        project.mkdir()
        script = write_script(project, "job.py", "import os, sys, time\nprint('job', sys.argv[1], flush=True)\n"
                              f"while not os.path.exists(os.path.join({str(gates)!r}, sys.argv[1])):\n"
                              "    time.sleep(0.1)\n")  # fmt: skip
        fleet = Fleet(client, servers, homes, str(script), gates, JUMPED if bastion else None, bastion, namespaces)
        if bastion:  # `--identity-file` is offered on every hop: box3's key lets it in on the bastion too
            (bastion.folder / "authorized_keys").write_text(Path(f"{servers[JUMPED].user_key}.pub").read_text())
        for name, server in servers.items():
            jump = fleet.jump if name == fleet.jumped else None
            fleet.add(name, fleet.destination(name), ["gpu"], homes[name], server.user_key, jump=jump)
        for name in BOXES:  # each daemon started once, with no fleet timeout to race
            client.ok("ps", "--host", name)
        yield fleet


@pytest.fixture(name="jobs_ended")
def jobs_ended_fixture(fleet: Fleet) -> Iterator[None]:
    """Each test leaves every box with its GPU free: its jobs are cancelled at its end."""
    yield
    for name in BOXES:
        fleet.client.run("cancel", "--all", "--host", name)
