"""Host keys as OpenSSH keeps them (issue 44): every known_hosts file ssh would read for a box vouches for its
key (UserKnownHostsFile with ~ and %-tokens expanded, GlobalKnownHostsFile, and their defaults, the global
/etc/ssh/ssh_known_hosts among them); a key pinned differently in any of them is a changed key, which
--accept-new-host-key never accepts; accept-new writes to the first user file; and `UserKnownHostsFile none`
or /dev/null never lets every key in. Against a real sshd; /etc/ssh is this test's own where it must hold a
file (a private mount namespace: the machine's is never touched)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from harness import Sshd, Tfrun, remote_client

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _other_key(tf: Tfrun, sshd: Sshd) -> str:
    """A known_hosts line pinning another key for the sshd: the box's real key, when the sshd answering is an
    impostor."""
    other = tf.client_home / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    return f"[{sshd.address}]:{sshd.port} {Path(f'{other}.pub').read_text().strip()}\n"


def _ssh_config(tf: Tfrun, text: str) -> None:
    config = tf.client_home / ".ssh" / "config"
    config.write_text(text)
    config.chmod(0o600)


def _own_etc_ssh(tf: Tfrun, folder: Path, known: str) -> None:
    """Run `tf`'s commands with `folder` mounted on /etc/ssh, holding ssh_known_hosts = `known`."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    folder.mkdir()
    (folder / "ssh_known_hosts").write_text(known)
    tf.prefix = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/ssh && exec "$@"', str(folder)]


@pytest.mark.parametrize("where", ["user-file", "global-file", "etc-ssh"])
def test_a_key_pinned_outside_known_hosts_is_never_replaced(tf: Tfrun, sshd: Sshd, tmp_path: Path, where: str) -> None:
    remote_client(tf, sshd, trust=False)
    pinned = _other_key(tf, sshd)
    if where == "user-file":  # the second user file, named with ~ and %-tokens
        pin = tf.client_home / "pins" / f"{sshd.address}-{sshd.port}"
        pin.parent.mkdir()
        _ssh_config(tf, "UserKnownHostsFile ~/.ssh/known_hosts ~/pins/%h-%p\n")
    elif where == "global-file":
        pin = tmp_path / "team_known_hosts"
        _ssh_config(tf, f"GlobalKnownHostsFile {pin}\n")
    else:
        pin = Path("/etc/ssh/ssh_known_hosts")
        _own_etc_ssh(tf, tmp_path / "etc-ssh", pinned)
    if where != "etc-ssh":
        pin.write_text(pinned)
    for extra in ([], ["--accept-new-host-key"]):
        result = tf.run("ps", *extra)
        assert result.returncode == 125, result.stderr
        line = _one_line(result.stderr)
        assert "has CHANGED" in line and f"ssh-keygen -R '[{sshd.address}]:{sshd.port}' -f '{pin}'" in line, line
    assert not (tf.client_home / ".ssh" / "known_hosts").exists(), "the impostor's key was written"
    assert not tf.home.exists(), "nothing reached the impostor"


@pytest.mark.parametrize("where", ["user-file", "etc-ssh"])
def test_a_key_pinned_where_ssh_looks_is_trusted(tf: Tfrun, sshd: Sshd, tmp_path: Path, where: str) -> None:
    remote_client(tf, sshd, trust=False)
    if where == "user-file":
        pin = tf.client_home / "pins" / f"{sshd.address}-{sshd.port}"
        pin.parent.mkdir()
        pin.write_text(sshd.known_hosts_line)
        _ssh_config(tf, "UserKnownHostsFile ~/pins/%h-%p\n")
    else:
        _own_etc_ssh(tf, tmp_path / "etc-ssh", sshd.known_hosts_line)
    result = tf.run("ps")
    assert result.returncode == 0, result.stderr


def test_accept_new_writes_to_the_first_user_file(tf: Tfrun, sshd: Sshd) -> None:
    remote_client(tf, sshd, trust=False)
    _ssh_config(tf, "UserKnownHostsFile ~/.ssh/kh-%p ~/.ssh/known_hosts\n")
    result = tf.run("ps", "--accept-new-host-key")
    assert result.returncode == 0, result.stderr
    written = (tf.client_home / ".ssh" / f"kh-{sshd.port}").read_text().split()
    assert written == sshd.known_hosts_line.split()[:3], written  # the key, without its comment
    assert not (tf.client_home / ".ssh" / "known_hosts").exists()
    result = tf.run("ps")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("value", ["none", "/dev/null"])
def test_user_known_hosts_none_does_not_let_every_key_in(tf: Tfrun, sshd: Sshd, value: str) -> None:
    remote_client(tf, sshd, trust=False)
    _ssh_config(tf, f"UserKnownHostsFile {value}\n")
    result = tf.run("ps")
    assert result.returncode == 125 and "is unknown" in _one_line(result.stderr), result.stderr
    result = tf.run("ps", "--accept-new-host-key")
    assert result.returncode == 125, result.stderr
    assert _one_line(result.stderr).endswith(
        f"is not accepted: ~/.ssh/config's UserKnownHostsFile for it is {value}, so a key accepted now would be "
        "forgotten and every connection would trust whoever answers; name a known_hosts file there, or add the key "
        "you checked to one"
    ), result.stderr
    assert not tf.home.exists(), "nothing reached a box whose key nobody checked"
