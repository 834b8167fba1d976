"""`tfrun ssh-config`: the Host block that plain ssh, VS Code and tfrun share, and its place in ~/.ssh/config."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Sshd, Tfrun, remote_client

KEEPALIVE = "    ServerAliveInterval 30\n    ServerAliveCountMax 4\n    TCPKeepAlive yes\n"
BOX_BLOCK = (
    "# Written by `tfrun ssh-config box`; run it again to change this block.\n"
    "Host box\n    HostName gpu-host\n    Port 2222\n    User tf\n" + KEEPALIVE
)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def ssh_config(tf: Tfrun) -> Path:
    return tf.client_home / ".ssh" / "config"


def managed(block: str, name: str = "box") -> str:
    return f"# >>> tfrun ssh-config {name} >>>\n{block}# <<< tfrun ssh-config {name} <<<\n"


def resolved(config: Path, host: str) -> dict[str, str]:
    """What OpenSSH itself makes of `config` for `host` (ssh -G: no connection), first value of each option."""
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    options: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key, value)
    return options


def test_prints_the_block_for_a_destination_with_user_and_port(tf: Tfrun, tmp_path: Path) -> None:
    result = tf.run("ssh-config", "box", "tf@gpu-host:2222")
    assert result.returncode == 0, result.stderr
    assert result.stdout == BOX_BLOCK
    assert "ControlMaster" not in result.stdout
    assert not ssh_config(tf).exists(), "printing writes nothing"

    # --user and --port win over the destination's; an ssh:// URL reads like user@host:port.
    assert tf.ok("ssh-config", "box", "ssh://alice@gpu-host:22", "--user", "tf", "--port", "2222") == BOX_BLOCK

    # OpenSSH reads the block as meant.
    printed = tmp_path / "printed_config"
    printed.write_text(result.stdout)
    options = resolved(printed, "box")
    assert (options["hostname"], options["port"], options["user"]) == ("gpu-host", "2222", "tf")
    keepalive = (options["serveraliveinterval"], options["serveralivecountmax"], options["tcpkeepalive"])
    assert keepalive == ("30", "4", "yes")


def test_the_identity_file_is_kept_as_given_and_json_says_it_all(tf: Tfrun) -> None:
    key = tf.client_home / ".ssh" / "id_box"
    key.parent.mkdir(mode=0o700)
    key.write_text("not a real key; only its existence is checked\n")
    printed = json.loads(tf.ok("ssh-config", "box", "gpu-host", "--identity-file", "~/.ssh/id_box", "--json"))
    block = (
        "# Written by `tfrun ssh-config box`; run it again to change this block.\n"
        "Host box\n    HostName gpu-host\n    IdentityFile ~/.ssh/id_box\n    IdentitiesOnly yes\n" + KEEPALIVE
    )
    assert printed == {
        "name": "box",
        "hostname": "gpu-host",
        "port": None,
        "user": None,
        "identity_file": "~/.ssh/id_box",
        "jump": None,
        "block": block,
        "written": None,
    }
    written = json.loads(
        tf.ok("ssh-config", "box", "gpu-host", "--identity-file", "~/.ssh/id_box", "--write", "--json")
    )
    assert written["written"] == str(ssh_config(tf))
    assert ssh_config(tf).read_text() == managed(block)


def test_write_creates_a_private_config_and_writing_again_changes_nothing(tf: Tfrun) -> None:
    result = tf.run("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote Host box to {ssh_config(tf)}\n"
    assert stat.S_IMODE(ssh_config(tf).parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(ssh_config(tf).stat().st_mode) == 0o600
    first = ssh_config(tf).read_bytes()
    assert first == managed(BOX_BLOCK).encode()

    tf.ok("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert ssh_config(tf).read_bytes() == first, "idempotent"

    tf.ok("ssh-config", "box", "tf@gpu-host:2200", "--write")
    assert ssh_config(tf).read_text() == managed(BOX_BLOCK.replace("2222", "2200")), "replaced, not added"
    assert sorted(p.name for p in ssh_config(tf).parent.iterdir()) == ["config"], "no temporary file left behind"


def test_write_goes_first_and_keeps_everything_else_byte_for_byte(tf: Tfrun) -> None:
    ssh_dir = tf.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o755)
    original = (
        b"# my settings \xff (not UTF-8)\n"
        b"Host *\n  User nobody\n  Port 22\n  ControlMaster auto\n\n"
        b"Host work\r\n  HostName work.example.com\n"
        b"  ServerAliveInterval 5"  # no final newline
    )
    ssh_config(tf).write_bytes(original)
    ssh_config(tf).chmod(0o644)

    tf.ok("ssh-config", "box", "tf@gpu-host:2222", "--write")
    expected = managed(BOX_BLOCK).encode() + b"\n" + original
    assert ssh_config(tf).read_bytes() == expected
    assert stat.S_IMODE(ssh_config(tf).stat().st_mode) == 0o644, "an existing file keeps its mode"
    options = resolved(ssh_config(tf), "box")
    assert (options["user"], options["port"]) == ("tf", "2222"), "Host * further down does not override the block"
    assert resolved(ssh_config(tf), "work")["user"] == "nobody", "the rest still works as before"

    tf.ok("ssh-config", "gpu2", "tf@other-host:2222", "--write")
    gpu2 = managed(BOX_BLOCK.replace("box", "gpu2").replace("gpu-host", "other-host"), "gpu2").encode()
    assert ssh_config(tf).read_bytes() == gpu2 + b"\n" + expected
    tf.ok("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert ssh_config(tf).read_bytes() == gpu2 + b"\n" + expected, "rewriting box keeps every block where it is"


def test_options_for_every_host_at_the_top_stay_for_every_host(tf: Tfrun) -> None:
    """Lines before a file's first Host apply to every host: below our block they must not become box's."""
    ssh_config(tf).parent.mkdir(mode=0o700)
    original = "User bob\nServerAliveInterval 99\n\nHost work\n  HostName work.example.com\n"
    ssh_config(tf).write_text(original)

    tf.ok("ssh-config", "box", "tf@gpu-host:2222", "--write")
    text = ssh_config(tf).read_text()
    assert text.startswith("# >>> tfrun ssh-config box >>>\n") and text.endswith("<<<\n\n" + original)
    assert resolved(ssh_config(tf), "work")["user"] == "bob"
    assert resolved(ssh_config(tf), "anything.example.com")["serveraliveinterval"] == "99"
    assert resolved(ssh_config(tf), "box")["user"] == "tf"
    tf.ok("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert ssh_config(tf).read_text() == text


def test_a_host_of_your_own_by_that_name_is_refused_and_the_file_left_alone(tf: Tfrun) -> None:
    ssh_config(tf).parent.mkdir(mode=0o700)
    original = "Host *\n  User nobody\n\n# the GPU box\nHost gpu box\n  HostName 10.0.0.7\n"
    ssh_config(tf).write_text(original)
    before = ssh_config(tf).stat()

    result = tf.run("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"{ssh_config(tf)}:5:" in line and "Host box" in line
    assert ssh_config(tf).read_text() == original
    assert ssh_config(tf).stat().st_mtime_ns == before.st_mtime_ns
    assert tf.run("ssh-config", "bo", "tf@gpu-host:2222", "--write").returncode == 0, "only exactly NAME clashes"


def test_a_symlinked_config_is_written_where_it_points(tf: Tfrun) -> None:
    dotfiles = tf.client_home / "dotfiles" / "ssh"
    dotfiles.mkdir(parents=True)
    (dotfiles / "config").write_text("Host *\n  User nobody\n")
    ssh_config(tf).parent.mkdir(mode=0o700)
    ssh_config(tf).symlink_to(dotfiles / "config")

    result = tf.run("ssh-config", "box", "tf@gpu-host:2222", "--write")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote Host box to {dotfiles / 'config'}\n"
    assert ssh_config(tf).is_symlink(), "the link stays a link"
    assert (dotfiles / "config").read_text() == managed(BOX_BLOCK) + "\nHost *\n  User nobody\n"
    assert sorted(p.name for p in dotfiles.iterdir()) == ["config"]


@pytest.mark.ssh
def test_plain_ssh_and_tfrun_reach_the_box_through_the_written_config(tf: Tfrun, sshd: Sshd) -> None:
    remote_client(tf, sshd)  # tfrun's host box is user@127.0.0.1:PORT, its key in ~/.ssh/id_ed25519
    key = tf.client_home / "keys" / "box_ed25519"
    key.parent.mkdir()
    shutil.move(str(tf.client_home / ".ssh" / "id_ed25519"), key)  # from now on only IdentityFile finds it
    key.chmod(0o600)

    # No DESTINATION: tfrun's own host box says where it is.
    tf.ok("ssh-config", "box", "--identity-file", str(key), "--write")
    text = ssh_config(tf).read_text()
    assert f"HostName 127.0.0.1\n    Port {sshd.port}\n    User {getpass.getuser()}\n" in text
    assert f"IdentityFile {key}\n    IdentitiesOnly yes\n" in text

    # Plain OpenSSH. It finds ~ from the password database, not $HOME, hence -F and UserKnownHostsFile.
    known_hosts = tf.client_home / ".ssh" / "known_hosts"
    command = ["ssh", "-F", str(ssh_config(tf)), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "BatchMode=yes",
               "box", "echo", "reached"]  # fmt: skip
    ssh = subprocess.run(command, env=tf.env, capture_output=True, text=True, timeout=60)
    assert ssh.returncode == 0 and ssh.stdout == "reached\n", ssh.stderr

    # tfrun: its host box now names the ssh alias box, as `tfrun hosts add box box` would; the address,
    # user, port and key come from ~/.ssh/config alone.
    host = json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"]
    tf.ok("hosts", "add", "box", "box", "--tfrund", host["tfrund"], "--env", f"TFRUN_HOME={host['env']['TFRUN_HOME']}")
    result = tf.run("ps", "--host", "box", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    assert not (tf.client_home / ".ssh" / "id_ed25519").exists()

    # Run again for a tfrun host that points at the block, the block is remade from itself: nothing changes.
    again = tf.run("ssh-config", "box", "--write")
    assert again.returncode == 0, again.stderr
    assert ssh_config(tf).read_text() == text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nobox"], "give DESTINATION"),
        (["my box", "gpu-host"], "cannot name an ssh host"),
        (["b*x", "gpu-host"], "cannot name an ssh host"),
        (["b?x", "gpu-host"], "cannot name an ssh host"),
        (["!box", "gpu-host"], "cannot name an ssh host"),
        (["box#1", "gpu-host"], "cannot name an ssh host"),
        (["--", "-box", "gpu-host"], "cannot name an ssh host"),
        (["box", "gpu-host", "--identity-file", "~/.ssh/nokey"], "identity file ~/.ssh/nokey does not exist"),
        (["box", "tf@"], "cannot read 'tf@' as an ssh destination"),
    ],
    ids=["no-destination", "space", "star", "question-mark", "bang", "hash", "dash", "no-identity-file", "bad-dest"],
)
def test_bad_input_is_one_line_and_exit_2(tf: Tfrun, args: list[str], expected: str) -> None:
    for write in ([], ["--write"]):
        result = tf.run("ssh-config", *write, *args)
        assert result.returncode == 2 and result.stdout == ""
        assert expected in one_line(result.stderr)
    assert not ssh_config(tf).parent.exists(), "nothing was written"
    assert not os.path.lexists(tf.home), "no daemon was started"


def _keyless_client(tf: Tfrun, sshd: Sshd) -> tuple[Path, list[str]]:
    """A client that trusts the box's host key but has no key in ~/.ssh: the login key lies elsewhere, so only
    an identity file named on purpose finds it. Returns the key, and the `hosts add` options for the box's
    tfrund (this Python), TFRUN_HOME and a job python with TensorFlow."""
    ssh_dir = tf.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line)
    key = tf.client_home / "keys" / "box_ed25519"
    key.parent.mkdir()
    shutil.copy(sshd.user_key, key)
    key.chmod(0o600)
    tfrund = shlex.join([sys.executable, "-m", "tfrun.runner"])
    return key, ["--tfrund", tfrund, "--env", f"TFRUN_HOME={tf.home}", "--python", sys.executable]


@pytest.mark.ssh
@pytest.mark.tensorflow
@pytest.mark.parametrize("order", ["hosts-add-first", "ssh-config-first"])
def test_either_order_of_hosts_add_and_ssh_config_reaches_the_box_with_the_named_key(
    tf: Tfrun, sshd: Sshd, order: str
) -> None:
    key, options = _keyless_client(tf, sshd)
    address = f"{getpass.getuser()}@127.0.0.1:{sshd.port}"
    if order == "hosts-add-first":
        tf.ok("hosts", "add", "box", address, *options)
        written = tf.ok("ssh-config", "box", "--identity-file", str(key), "--write")
        assert "tfrun's host box now reaches the box through it" in written
    else:
        tf.ok("ssh-config", "box", address, "--identity-file", str(key), "--write")
        tf.ok("hosts", "add", "box", "box", *options)
    # The same either way: tfrun's host names the alias, whose block holds address, user, port and key.
    assert json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"] == {
        "destination": "box",
        "tfrund": options[1],
        "python": sys.executable,
        "env": {"TFRUN_HOME": str(tf.home)},
    }
    assert f"IdentityFile {key}\n" in ssh_config(tf).read_text()
    check = tf.run("hosts", "check", "box", timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"ok  ssh: connected to box as {getpass.getuser()}" in check.stdout
    assert "ok  tensorflow: " in check.stdout
    assert not (tf.client_home / ".ssh" / "id_ed25519").exists()


@pytest.mark.ssh
def test_a_host_of_your_own_in_ssh_config_is_a_destination(tf: Tfrun, sshd: Sshd) -> None:
    """HostName, Port, User and IdentityFile of a `Host gpu` the user wrote apply to tfrun's host box at gpu."""
    key, options = _keyless_client(tf, sshd)
    ssh_config(tf).write_text(
        f"Host gpu\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {getpass.getuser()}\n"
        f"    IdentityFile {key}\n"
    )
    tf.ok("hosts", "add", "box", "gpu", *options)
    result = tf.run("ps", "--host", "box", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stderr


def test_jump_hosts_become_proxyjump_and_come_from_the_tfrun_host(tf: Tfrun, tmp_path: Path) -> None:
    tf.ok("hosts", "add", "box", "tf@gpu-host:2222", "--jump", "me@bastion:2200,gate")
    printed = tmp_path / "printed_config"
    printed.write_text(tf.ok("ssh-config", "box"))
    assert "    ProxyJump me@bastion:2200,gate\n" in printed.read_text()
    assert resolved(printed, "box")["proxyjump"] == "me@bastion:2200,gate"
    bad = tf.run("ssh-config", "box", "gpu-host", "--jump", "me@")
    assert bad.returncode == 2 and "jump host" in one_line(bad.stderr)


@pytest.mark.ssh
@pytest.mark.tensorflow
def test_a_block_for_a_host_of_your_own_keeps_what_your_block_says(tf: Tfrun, sshd: Sshd) -> None:
    """`tfrun ssh-config box --write` for tfrun's host box at `gpu`, a Host of the user's own: the block said
    `HostName gpu` and lost gpu's HostName, Port, User and key (ssh does not read the config again for a
    HostName), so box no longer reached the box. It now holds what gpu's block says, as OpenSSH reads it."""
    key, options = _keyless_client(tf, sshd)
    user = getpass.getuser()
    ssh_config(tf).write_text(
        f"Host gpu\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {user}\n    IdentityFile {key}\n"
    )
    tf.ok("hosts", "add", "box", "gpu", *options)
    tf.ok("ssh-config", "box", "--write")
    seen = resolved(ssh_config(tf), "box")
    assert (seen["hostname"], seen["port"], seen["user"], seen["identityfile"]) == (
        "127.0.0.1",
        str(sshd.port),
        user,
        str(key),
    )
    result = tf.run("ps", "--host", "box", "--json")  # tfrun now reaches the box through the block
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stderr
    # --port still wins over what the user's block says
    assert "    Port 2200\n" in tf.ok("ssh-config", "other", "gpu", "--port", "2200")
