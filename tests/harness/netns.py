"""Network namespaces that a test makes itself, joined by veth pairs: a network of its own, never the host's.

    with Network("bastion") as net:
        client, jump, box = net.namespace("client"), net.namespace("jump"), net.namespace("box")
        client_addr, jump_addr = net.link(client, jump)      # 10.201.0.1 <-> 10.201.0.2 (a /30 each)
        jump_inner, box_addr = net.link(jump, box)           # 10.201.0.5 <-> 10.201.0.6
        subprocess.run([*box.exec, "/usr/sbin/sshd", ...])   # a process inside the box's namespace

Each namespace has loopback up, no default route and IP forwarding off, so a namespace reaches only the
addresses on its own links: from `client` above, `box_addr` is unreachable (ENETUNREACH at once) except
through a process in `jump` that relays, such as an sshd doing ProxyJump's direct-tcpip. Every link is a /30
of 10.201.0.0/16 that exists only inside the namespaces it joins, so tests running at the same time never
collide and nothing is added to the root namespace. Names carry the pid and a counter (unique per process);
leaving the `with` deletes every namespace made, and their veths with them, whatever happened inside.

Making a namespace needs CAP_SYS_ADMIN (root): without it, or without iproute2, `Unavailable` is raised.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from types import TracebackType
from typing import Optional

_SEQUENCE = itertools.count()  # per process: with the pid, it makes every name unique on this machine


class Unavailable(Exception):
    """Network namespaces cannot be made here (not root, no CAP_SYS_ADMIN, no iproute2); says why."""


@dataclass(frozen=True)
class Namespace:
    """A named network namespace (`ip netns`), as /run/netns/NAME."""

    name: str

    @property
    def exec(self) -> list[str]:
        """The prefix that runs a command inside this namespace."""
        return ["ip", "netns", "exec", self.name]

    @property
    def inode(self) -> int:
        """The namespace's inode: what /proc/PID/ns/net reads as net:[INODE] for a process inside it."""
        return os.stat(f"/run/netns/{self.name}").st_ino


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    result = _ip(*args)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


class Network:
    """Namespaces and the veth pairs between them; a context manager that deletes them all on exit."""

    def __init__(self, tag: str) -> None:
        """`tag` goes into every name (tfrun-PID-N-TAG-ROLE), to tell whose namespaces `ip netns` lists."""
        self.prefix = f"tfrun-{os.getpid()}-{next(_SEQUENCE)}-{tag}"
        self.namespaces: list[Namespace] = []
        self.links = 0

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]
    ) -> None:
        self.close()

    def namespace(self, role: str) -> Namespace:
        """A new namespace with loopback up and forwarding off; Unavailable where none may be made."""
        if shutil.which("ip") is None:
            raise Unavailable("iproute2 (`ip`) is not installed (.ci/run installs it)")
        space = Namespace(f"{self.prefix}-{role}")
        if os.path.exists(f"/run/netns/{space.name}"):  # left by a run that died with this same pid
            _ip("netns", "delete", space.name)
        result = _ip("netns", "add", space.name)
        if result.returncode != 0:
            raise Unavailable(f"`ip netns add` is not permitted here (it needs root): {result.stderr.strip()}")
        self.namespaces.append(space)
        _must("-n", space.name, "link", "set", "lo", "up")
        # /proc/sys/net shows the namespace of whoever opens it (no procps needed for sysctl)
        forwarding = "echo 0 > /proc/sys/net/ipv4/ip_forward"
        subprocess.run([*space.exec, "sh", "-c", forwarding], check=True, timeout=30)
        return space

    def link(self, a: Namespace, b: Namespace) -> tuple[str, str]:
        """Join `a` and `b` by a veth pair on a /30 of their own; the (address in a, address in b)."""
        index = self.links
        self.links += 1
        assert index < 1 << 14, "10.201.0.0/16 holds 16384 links"
        subnet, offset = f"10.201.{index // 64}", (index % 64) * 4  # the /30 at 10.201.0.0 + 4 * index
        addr_a, addr_b = f"{subnet}.{offset + 1}", f"{subnet}.{offset + 2}"
        tag = f"{os.getpid()}{index}"[-11:]  # an interface name has at most 15 characters
        end_a, end_b = f"ve{tag}a", f"ve{tag}b"
        # Each end is made straight inside its namespace: the root namespace never holds either.
        _must("link", "add", end_a, "netns", a.name, "type", "veth", "peer", "name", end_b, "netns", b.name)
        for space, end, address in ((a, end_a, addr_a), (b, end_b, addr_b)):
            _must("-n", space.name, "addr", "add", f"{address}/30", "dev", end)
            _must("-n", space.name, "link", "set", end, "up")
        return addr_a, addr_b

    def close(self) -> None:
        """Delete every namespace made; a veth goes with the namespace it is in. Processes still inside one
        keep it alive until they exit, so a test stops its own processes first."""
        for space in reversed(self.namespaces):
            _ip("netns", "delete", space.name)
        self.namespaces.clear()
