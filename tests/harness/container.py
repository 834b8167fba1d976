"""The box (container/) as `docker run` would run it, with no Docker engine: the same files play Docker's part.

debootstrap makes a Debian root (cached between runs), the Dockerfile's RUN line runs container/setup.sh in it, and
each boot starts the Dockerfile's ENTRYPOINT (tini, then container/entrypoint.sh) as PID 1 of new PID, mount, UTS,
IPC and network namespaces, with the Dockerfile's ENV over a stand-in for the TF image's own, and the volumes,
variables and port of the README's `docker run` line. A veth pair is the box's only network: a `Client` reaches its
sshd at 10.x.y.2 as a user reaches the box, with plain ssh and with tfrun.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib
from .paths import CACHE, REPO
from .processes import wait_for

CONTAINER = REPO / "container"

SUITE = "bookworm"  # its python3 is 3.11: the wheels below are for that

MIRROR = os.environ.get("TFRUN_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")

README_MARK = "<!-- the box: tests/test_container.py runs these commands -->"

# What tensorflow/tensorflow:2.9.0-gpu (from nvidia/cuda) sets as ENV, which a Debian root has not got: the
# variables a session on the box must see. NVIDIA_REQUIRE_CUDA's spaces, commas and < > are kept on purpose.
BASE_IMAGE_ENV = {
    "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH": "/usr/local/cuda/extras/CUPTI/lib64:/usr/local/cuda/lib64:/usr/local/nvidia/lib:"
    "/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    "NVIDIA_REQUIRE_CUDA": "cuda>=11.2 brand=tesla,driver>=418,driver<419 brand=tesla,driver>=440,driver<441",
    "CUDA_VERSION": "11.2.1",
    "LANG": "C.UTF-8",
}


# -- the recipe ------------------------------------------------------------------------------------------


@dataclass
class Dockerfile:
    """The instructions this test carries out itself, read from container/Dockerfile."""

    base: str = ""  # FROM, its ${TF_TAG} filled in
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    run: list[str] = field(default_factory=list)
    copy: list[tuple[str, str]] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        parsed = cls()
        text = re.sub(r"\\\n", " ", path.read_text())
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            rest = parsed.substitute(rest.strip())
            if word == "FROM":
                parsed.base = rest
            elif word == "ARG":
                name, _, default = rest.partition("=")
                parsed.args[name] = default
            elif word == "ENV":
                parsed.env.update(pair.split("=", 1) for pair in shlex.split(rest))  # type: ignore[misc]
            elif word == "RUN":
                parsed.run.append(rest)
            elif word == "COPY":
                source, target = rest.split()
                parsed.copy.append((source, target))
            elif word == "VOLUME":
                parsed.volumes = json.loads(rest)
            elif word == "ENTRYPOINT":
                parsed.entrypoint = json.loads(rest)
            elif word == "HEALTHCHECK":
                parsed.healthcheck = json.loads(rest.split(" CMD ", 1)[1])
            elif word == "EXPOSE":
                parsed.expose = rest.split()
        return parsed

    def substitute(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: {**self.args, **self.env}.get(m[1], m[0]), text)


DOCKERFILE = Dockerfile.read(CONTAINER / "Dockerfile")


def readme_commands() -> list[str]:
    """The README's commands for the box (its fenced block after README_MARK), continuations joined."""
    text = (REPO / "README.md").read_text()
    assert README_MARK in text, "README.md lost the box's tested commands"
    block = text.split(README_MARK, 1)[1].split("```", 2)[1]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines()[1:] if line.strip() and not line.startswith("#")]


def readme_command(prefix: str) -> list[str]:
    matches = [line for line in readme_commands() if line.startswith(prefix)]
    assert len(matches) == 1, f"README should show one `{prefix} ...` command for the box, has {matches}"
    return shlex.split(matches[0])


@dataclass
class RunOptions:
    """What the README's `docker run` line asks of Docker: published port, volumes, variables."""

    port: str
    volumes: dict[str, str]  # container path -> volume name or host path
    env: dict[str, str]  # name -> value as written
    image: str

    @classmethod
    def from_readme(cls) -> RunOptions:
        words = readme_command("docker run")
        port, volumes, env, rest = "", {}, {}, []
        i = 2
        while i < len(words):
            word = words[i]
            if word in ("-p", "-v", "-e", "--name", "--gpus", "--shm-size", "--restart", "--hostname"):
                value = words[i + 1]
                i += 2
                if word == "-p":
                    port = value.rsplit(":", 1)[1]
                elif word == "-v":
                    source, target = value.split(":")[:2]
                    volumes[target] = source
                elif word == "-e":
                    name, _, val = value.partition("=")
                    env[name] = val
                continue
            if word.startswith("-"):
                i += 1
                continue
            rest.append(word)
            i += 1
        return cls(port, volumes, env, rest[0] if rest else "")


def sh(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A command that must succeed, its output captured: a failure fails the test with what it printed."""
    result = subprocess.run(args, capture_output=True, text=True, **kw)
    assert result.returncode == 0, f"{shlex.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def ssh_banner(address: str, port: int) -> Optional[bytes]:
    """The SSH identification line that answers at address:port, or None (nothing listens, or not sshd)."""
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect((address, port))
            line = sock.recv(64)
        except OSError:
            return None
    return line if line.startswith(b"SSH-2.0-") else None


def debian_tarball(suite: str = SUITE, include: tuple[str, ...] = ()) -> Path:
    """A minimal Debian (with `include`'s packages) as a tarball in the cache: one debootstrap, kept across runs
    (the Debian root of these tests, and the stand-in for the TF image of tests/test_container_engine.py)."""
    tarball = CACHE / ("-".join(["debian", suite, "minbase", *include]) + ".tar")
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        work = CACHE / f"debootstrap.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        packages = [f"--include={','.join(include)}"] * bool(include)
        sh("debootstrap", "--variant=minbase", *packages, suite, str(work), MIRROR, timeout=1200)
        sh("tar", "-C", str(work), "-cf", f"{tarball}.{os.getpid()}", ".")
        os.replace(f"{tarball}.{os.getpid()}", tarball)
        shutil.rmtree(work, ignore_errors=True)
    return tarball


def _wheelhouse() -> Path:
    """tfrun's dependencies as wheels for the chroot's Python, so setup.sh's pip needs no network of its own.

    A Docker build reaches PyPI itself; here the chroot has no CA bundle for this machine's registry proxy,
    so pip in it installs offline from these (PIP_NO_INDEX, PIP_FIND_LINKS), as an air-gapped build would.
    """
    wheels = CACHE / "wheels-cp311"
    wheels.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    arch = os.uname().machine
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(17, 37)] + [f"manylinux2014_{arch}"]
    sh(
        sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "--only-binary=:all:",
        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        *(f"--platform={p}" for p in platforms), *requirements, timeout=900,
    )  # fmt: skip
    return wheels


def _copy_source(target: Path) -> None:
    """`COPY . /opt/tfrun/src`: the files git would commit (tracked or not ignored), symlinks kept."""
    listing = sh("git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)


def build_image(root: Path) -> None:
    """What `docker build` does with container/Dockerfile, on a Debian root instead of the TF image."""
    sh("tar", "-C", str(root), "-xpf", str(debian_tarball()))
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # As in Docker's Debian images: packages must not start services while the image is built.
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    (source_dir,) = [target for source, target in DOCKERFILE.copy if source == "."]
    _copy_source(root / source_dir.lstrip("/"))
    wheels = _wheelhouse()
    (root / "wheels").mkdir()
    for command in DOCKERFILE.run:
        script = (
            f"set -e; mount -t proc proc {root}/proc; mount --rbind /dev {root}/dev; "
            f"mount --bind {wheels} {root}/wheels; "
            f"exec chroot {root} /bin/bash -o pipefail -c {shlex.quote(command)}"
        )
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": "/wheels",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
        result = subprocess.run(
            ["unshare", "--mount", "--fork", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=1500
        )
        assert result.returncode == 0, f"RUN {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    (root / "wheels").rmdir()


@dataclass
class Box:
    """One container made from the built root: booted, stopped and booted again like `docker start`."""

    root: Path
    volumes: dict[str, Path]  # container path -> host folder (Docker's named volumes and bind mounts)
    env: dict[str, str]
    keys_file: Optional[Path] = None
    address: str = ""
    proc: Optional[subprocess.Popen[bytes]] = None
    log: Optional[Path] = None
    boots: int = 0

    def boot(self) -> None:
        """`docker start`: ENTRYPOINT as PID 1 of fresh namespaces, volumes mounted, a veth as its network."""
        mounts = [f"mount -t proc proc {self.root}/proc", f"mount --rbind /dev {self.root}/dev",
                  f"mount --rbind /sys {self.root}/sys"]  # fmt: skip
        for target, source in self.volumes.items():
            mounts.append(f"mount --bind {shlex.quote(str(source))} {self.root}{target}")
        if self.keys_file:
            (self.root / "etc" / "tfrun" / "authorized_keys").touch()
            mounts.append(f"mount --bind -o ro {self.keys_file} {self.root}/etc/tfrun/authorized_keys")
        script = "; ".join(
            ["set -e", *mounts, "hostname box", "ip link set lo up",
             f"exec chroot {self.root} {shlex.join(DOCKERFILE.entrypoint)}"]
        )  # fmt: skip
        self.boots += 1
        self.log = self.root.parent / f"boot{self.boots}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--pid", "--net", "--mount", "--uts", "--ipc", "--fork", "--kill-child",
                 "sh", "-c", script],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._network()
        wait_for(self._sshd_answers, timeout=60, what="the box's sshd")

    def _network(self) -> None:
        assert self.proc is not None
        outside = f"tfb{os.getpid() % 10000}x{self.boots}"
        inside = f"{outside}i"
        if not self.address:  # kept across boots, as `docker start` keeps the published port's address
            self.address = f"10.254.{random.randrange(256)}.{random.randrange(64) * 4 + 2}"
        subnet, last = self.address.rsplit(".", 1)
        net = int(last) - 2
        ns = f"--net=/proc/{self.proc.pid}/ns/net"
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        sh("ip", "link", "set", inside, "netns", str(self.proc.pid))
        sh("ip", "addr", "add", f"{subnet}.{net + 1}/30", "dev", outside)
        sh("ip", "link", "set", outside, "up")
        sh("nsenter", ns, "ip", "link", "set", inside, "name", "eth0")
        sh("nsenter", ns, "ip", "addr", "add", f"{self.address}/30", "dev", "eth0")
        sh("nsenter", ns, "ip", "link", "set", "eth0", "up")

    def _sshd_answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the box exited ({self.proc.returncode}):\n{self.output()}")
        return ssh_banner(self.address, 22) is not None

    @property
    def user(self) -> str:
        """The box's user, as setup.sh recorded it from the Dockerfile's TFRUN_USER."""
        return (self.root / "etc" / "tfrun" / "user").read_text().strip()

    def init_pid(self) -> int:
        """PID 1 of the box (tini), as this side numbers it."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    def exec(self, *command: str, user: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`docker exec [-u USER] box COMMAND`: inside every namespace and the root, with the image's env."""
        prefix = ["setpriv", "--reuid", user, "--regid", user, "--init-groups", "--"] if user else []
        result = subprocess.run(
            ["nsenter", "-t", str(self.init_pid()), "-p", "-m", "-n", "-u", "-i", "-r", "-w", *prefix, *command],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check:
            assert result.returncode == 0, f"exec {command} -> {result.returncode}\n{result.stdout}{result.stderr}"
        return result

    def stop(self, grace: float = 10.0) -> tuple[int, float]:
        """`docker stop`: SIGTERM to PID 1, then (as Docker does after the grace time) SIGKILL."""
        assert self.proc is not None
        started = time.monotonic()
        os.kill(self.init_pid(), signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, time.monotonic() - started

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
