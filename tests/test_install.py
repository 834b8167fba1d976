"""`tfrun hosts install` and `hosts add --install`: a box with nothing but an SSH login gets tfrund.

The box is a real sshd on 127.0.0.1 whose sessions get a HOME of their own and a PATH of the system's folders
after the folder of the Python this test runs on (whose venv module works: the tests' venv was made with it),
both by sshd's SetEnv: no tfrund there, and the install lands in that HOME. Its dependencies come offline from a
local folder of wheels for the box's Python (TFRUN_WHEELHOUSE), filled once from PyPI into the tests' cache
(`~/.cache/tfrun-tests`, shared with tests/test_container.py) and read from there without network after.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sshd, Tfrun, write_script
from harness.paths import CACHE, REPO

from tfrun import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib


pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(600)]


def trust(tf: Tfrun, server: Sshd) -> str:
    """The client's key and known_hosts for `server`; its destination."""
    ssh_dir = tf.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(server.user_key, ssh_dir / "id_ed25519")
    (ssh_dir / "id_ed25519").chmod(0o600)
    with open(ssh_dir / "known_hosts", "a") as known:
        known.write(server.known_hosts_line)
    return f"{getpass.getuser()}@127.0.0.1:{server.port}"


def box_python(server: Sshd, known_hosts: Path) -> str:
    """The version (3.X) of the python3 a session on the box finds."""
    login = ["ssh", "-p", str(server.port), "-i", str(server.user_key), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", f"{getpass.getuser()}@127.0.0.1"]  # fmt: skip
    command = [*login, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def wheelhouse(python: str) -> Path:
    """Wheels of tfrun's dependencies for CPython `python` on this machine's platform: from the cache when it
    has them all (no network), else downloaded into it once; the test is skipped when neither works."""
    folder = CACHE / f"wheels-cp{python.replace('.', '')}"
    folder.mkdir(parents=True, exist_ok=True)
    requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    arch = os.uname().machine
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
              f"--abi=cp{python.replace('.', '')}", "--abi=abi3", "--abi=none", f"--platform=manylinux2014_{arch}",
              *(f"--platform=manylinux_2_{minor}_{arch}" for minor in range(17, 37))]  # fmt: skip
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(folder)]
    cached = subprocess.run([*pip, "--no-index", f"--find-links={folder}", *target, *requirements], capture_output=True)
    if cached.returncode != 0:
        fetched = subprocess.run([*pip, *target, *requirements], capture_output=True, text=True, timeout=900)
        if fetched.returncode != 0:
            pytest.skip(f"no wheels of tfrun's dependencies in {folder}, and PyPI cannot be reached to fetch them")
    return folder


def start_bare_box(tmp_path: Path, *first_on_path: Path) -> tuple[Sshd, Path]:
    """A box that never had tfrun: an sshd whose sessions' HOME is a new folder and whose PATH holds no tfrund
    (the folders given first, then the system's and this Python's base); (its sshd, that HOME)."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    home = tmp_path / "box-home"
    home.mkdir()
    path = ":".join([*map(str, first_on_path), str(Path(sys.base_prefix) / "bin"), "/usr/local/bin:/usr/bin:/bin"])
    return Sshd(tmp_path / "box-sshd", env={"HOME": str(home), "PATH": path}), home


@pytest.fixture
def bare_box(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    server, home = start_bare_box(tmp_path)
    yield server, home
    server.stop()


@pytest.mark.tensorflow
def test_hosts_add_install_gives_a_bare_box_tfrund_and_upgrades_it(
    tf: Tfrun, bare_box: tuple[Sshd, Path], project: Path
) -> None:
    server, box_home = bare_box
    destination = trust(tf, server)
    tf.env["TFRUN_WHEELHOUSE"] = str(wheelhouse(box_python(server, tf.client_home / ".ssh" / "known_hosts")))
    tf.ok("hosts", "add", "box", destination, "--env", f"TFRUN_HOME={tf.home}")
    check = tf.run("hosts", "check", "box")
    assert check.returncode == 125
    assert "FAIL tfrund: 'tfrund' not found on the box" in check.stdout
    assert "tfrun hosts install box" in check.stdout and "--tfrund PATH" in check.stdout
    write_script(project, "hello.py", "print('hello from the box')\n")
    ps = tf.run("ps")
    assert ps.returncode == 125 and "tfrun hosts install box" in ps.stderr, ps.stderr

    # Jobs get this test's interpreter, which has TensorFlow (hosts check imports it); tfrund gets its own venv.
    job_python = ["--python", sys.executable]
    added = tf.run("hosts", "add", "box", destination, "--env", f"TFRUN_HOME={tf.home}", *job_python, "--install")
    assert added.returncode == 0, added.stderr
    venv = box_home / ".local" / "share" / "tfrun" / "venv"
    tfrund = venv / "bin" / "tfrund"
    assert added.stdout.splitlines()[-1].startswith(f"installed tfrund {__version__} on box: {tfrund} (running, pid")
    for step in ("copying", "making the venv", "installing"):
        assert f"tfrun: {step}" in added.stderr, added.stderr
    config = tomllib.loads((tf.client_home / ".config" / "tfrun" / "config.toml").read_text())
    assert config["hosts"]["box"]["tfrund"] == str(tfrund)
    check = tf.run("hosts", "check", "box")
    assert check.returncode == 0 and "FAIL" not in check.stdout, check.stdout
    assert f"ok  tfrund: tfrund, version {__version__}" in check.stdout
    assert tf.ok("submit", "-f", str(project / "hello.py")) == "hello from the box\n"

    # Again with the same version: nothing to do.
    again = json.loads(tf.ok("hosts", "install", "box", "--json"))
    assert again["action"] == "unchanged" and again["version"] == __version__ and again["tfrund"] == str(tfrund)
    assert tf.run("hosts", "install", "box").stdout.startswith(
        f"tfrund {__version__} already installed on box: {tfrund} (running, pid {again['daemon_pid']})"
    )
    forced = json.loads(tf.ok("hosts", "install", "box", "--force", "--json"))
    assert forced["action"] == "reinstalled" and forced["daemon_pid"] != again["daemon_pid"]

    # An older tfrun on the box: check says so and how to fix it; install upgrades it and restarts tfrund.
    (site,) = venv.glob("lib/python*/site-packages")
    for path, pattern, old in (
        (next(site.glob("tfrun-*.dist-info")) / "METADATA", r"(?m)^Version: .*$", "Version: 0.0.1"),
        (site / "tfrun" / "__init__.py", r'__version__ = ".*"', '__version__ = "0.0.1"'),
    ):
        path.write_text(re.sub(pattern, old, path.read_text(), count=1))
    # The edit keeps the file's size and may fall in the second it was installed: its .pyc would still pass as
    # fresh (Python compares size and whole-second mtime) and tfrund would report the real version.
    shutil.rmtree(site / "tfrun" / "__pycache__")
    check = tf.run("hosts", "check", "box")
    assert check.returncode == 1  # an older tfrund answers: the box is reached, not ready (125: not reached)
    assert f"FAIL tfrund: the box has 0.0.1, this client {__version__}: upgrade it with `tfrun hosts install box`" in (
        check.stdout
    )
    upgraded = json.loads(tf.ok("hosts", "install", "box", "--json"))
    assert (upgraded["action"], upgraded["previous"], upgraded["version"]) == ("upgraded", "0.0.1", __version__)
    assert upgraded["daemon_pid"] != forced["daemon_pid"], "the old tfrund makes way for the new one"
    assert tf.run("hosts", "check", "box").returncode == 0
    assert tf.ok("submit", "-f", str(project / "hello.py")) == "hello from the box\n"


def test_a_box_without_python_3_9_is_told_what_it_has(tf: Tfrun, tmp_path: Path) -> None:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    empty = tmp_path / "bin"
    empty.mkdir()
    server = Sshd(tmp_path / "sshd", env={"HOME": str(tmp_path), "PATH": str(empty)})
    try:
        added = tf.run("hosts", "add", "old", trust(tf, server), "--install")
        assert added.returncode == 1
        (line,) = added.stderr.splitlines()
        assert line.startswith("tfrun: error: no Python 3.9 or newer on old to run tfrund: found no python3")
        assert f"on its PATH ({empty})" in line and "tfrun hosts install old --python PATH" in line
        assert not (tmp_path / ".local").exists()
    finally:
        server.stop()
