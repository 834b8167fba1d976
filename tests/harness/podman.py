"""The box built and run by a real container engine: Podman, rootful, with a storage of the test's own.

Podman plays Docker: it builds container/Dockerfile as written, on a stand-in for the TF image (no registry can be
reached here), and runs the README's `docker run` line. What this host needs of it (issue 45): runc (crun refuses
its hybrid cgroups), the docker image format (OCI's drops HEALTHCHECK), the host's network to build (no bridge is
set up), ulimits given outright (Podman's defaults exceed the hard limits, and there is no CAP_SYS_RESOURCE to
raise them), and slirp4netns with its own port handler, so the host's forwarding settings and firewall are left
alone: the box's sshd is published on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .container import BASE_IMAGE_ENV, DOCKERFILE, debian_tarball, ssh_banner
from .paths import REPO
from .processes import wait_for

PODMAN = shutil.which("podman")

# The stand-in for tensorflow/tensorflow:2.9.0-gpu, which is Ubuntu 20.04 with Python 3.8 and glibc 2.31:
# Debian 11 has the same glibc (the same manylinux wheels install) and OpenSSH 8.4 to focal's 8.2. Its Python is
# 3.9, the nearest Debian has: buster's 3.7 is older than tfrund's 3.9 and has no python3.9 for setup.sh to add.
STANDIN_SUITE = "bullseye"

# What `podman run` must be told on this host beside the README's options (see the module's docstring).
HOST_RUN_OPTIONS = ["--network", "slirp4netns:port_handler=slirp4netns", "--pull=never"]


@dataclass
class Podman:
    """`podman` with this host's options, its images, containers and volumes under `folder` (`reset` ends them)."""

    folder: Path
    # The run-time state, sockets among them: slirp4netns refuses an API socket path of 108 bytes or more.
    short: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tfpm", dir="/tmp")))

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        assert PODMAN is not None
        storage = ["--root", str(self.folder / "storage"), "--runroot", str(self.short / "run"),
                   "--volumepath", str(self.folder / "volumes"), "--tmpdir", str(self.short / "tmp")]  # fmt: skip
        command = [PODMAN, *storage, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, f"podman {shlex.join(args)} -> {result.returncode}\n{result.stderr[-3000:]}"
        return result

    def inspect(self, what: str, name: str) -> Any:
        """`podman {image,container,volume} inspect NAME`, parsed: the first (only) object."""
        return json.loads(self(what, "inspect", name).stdout)[0]

    def reset(self) -> None:
        """Every container stopped and removed, then the storage itself: nothing of this run stays mounted (the
        overlay driver mounts its folder on itself, which `system reset` leaves)."""
        self("rm", "--all", "--force", "--time", "0", check=False)
        self("system", "reset", "--force", check=False)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for target in reversed(mounts):
            if Path(target).is_relative_to(self.folder) or Path(target).is_relative_to(self.short):
                subprocess.run(["umount", target], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.short, ignore_errors=True)


def standin_image(podman: Podman) -> str:
    """The Dockerfile's FROM image made from a cached debootstrap root with python3, with the TF image's ENV."""
    tarball = debian_tarball(STANDIN_SUITE, ("python3",))
    name = f"docker.io/{DOCKERFILE.base}"
    changes = [f"--change=ENV {key}={json.dumps(value)}" for key, value in BASE_IMAGE_ENV.items()]
    podman("import", *changes, '--change=CMD ["bash"]', str(tarball), name)
    return name


@dataclass
class Built:
    """The image `podman build` made: its name, the build's seconds and the image's size in bytes."""

    tag: str
    seconds: float
    size: int


def build_box(podman: Podman, tag: str) -> Built:
    """`docker build -f container/Dockerfile -t TAG .` with Podman. As Docker's would, the build reaches Debian's
    mirror and PyPI itself; a pip.conf mounted for the build only hands pip this host's CA bundle (it may hold a
    registry proxy's root, which the image's own bundle lacks)."""
    bundle = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    pip_conf = podman.folder / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/pip-ca.crt\n")
    started = time.monotonic()
    podman(
        "build", "--format", "docker", "--network", "host", "--pull=never", "--layers=false",
        "--volume", f"{bundle}:/etc/pip-ca.crt:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro",
        "-f", str(REPO / "container" / "Dockerfile"), "-t", tag, str(REPO), timeout=1200,
    )  # fmt: skip
    seconds = time.monotonic() - started
    return Built(tag, seconds, int(podman.inspect("image", tag)["Size"]))


def ulimits() -> list[str]:
    """`--ulimit` for open files at this process's own limits, which need no privilege to keep, and processes at
    Podman's default (32768): Podman lowers its own limit to that, and a container may not have more than it."""
    files = resource.getrlimit(resource.RLIMIT_NOFILE)
    processes = [min(32768, value) if value != resource.RLIM_INFINITY else 32768 for value in
                 resource.getrlimit(resource.RLIMIT_NPROC)]  # fmt: skip
    return ["--ulimit", "nofile={}:{}".format(*files), "--ulimit", "nproc={}:{}".format(*processes)]


@dataclass
class Container:
    """One `podman run` of the box, by name, its sshd published on 127.0.0.1:`port`."""

    podman: Podman
    name: str
    run_options: list[str]  # `podman run`'s options and image, as the README gives them for Docker
    port: int
    address: str = "127.0.0.1"
    ssh_after: float = 0.0  # seconds from the last `podman run` to sshd's banner

    def run(self) -> None:
        """`podman run -d ...`, until the box's sshd answers with its banner."""
        started = time.monotonic()
        self.podman("run", *HOST_RUN_OPTIONS, *ulimits(), *self.run_options)
        self.wait_for_sshd(started)
        self.ssh_after = time.monotonic() - started

    def wait_for_sshd(self, started: float) -> None:
        def answers() -> bool:
            if ssh_banner(self.address, self.port) is not None:
                return True
            state = self.state()
            assert state["Running"], f"the box exited ({state['ExitCode']}):\n{self.logs()}"
            time.sleep(0.2)  # a podman inspect takes a tenth of a second of CPU
            return False

        wait_for(answers, timeout=60 - (time.monotonic() - started), what="the box's sshd")

    def logs(self) -> str:
        """`podman logs`: the entrypoint's and tfrund's lines (they share its stderr)."""
        result = self.podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def exec(self, *command: str, user: str = "root") -> subprocess.CompletedProcess[str]:
        return self.podman("exec", "--user", user, self.name, *command)

    def state(self) -> dict[str, Any]:
        return dict(self.podman.inspect("container", self.name)["State"])

    def volume(self, name: str) -> Path:
        """Where a named volume's files lie on this side."""
        return Path(self.podman.inspect("volume", name)["Mountpoint"])
