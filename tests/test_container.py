"""The box (container/) boots and serves as `docker run` would run it (harness/container.py plays Docker's part):
key logins only, the image's environment in every session and job, the README's submit and follow over its sshd,
a killed tfrund back with its job running, tfrund in its own venv, the healthcheck, a stop and start that keep the
host key and the history.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from harness import free_port, wait_for
from harness.boxclient import Client
from harness.container import BASE_IMAGE_ENV, DOCKERFILE, Box, RunOptions, build_image, readme_command, sh, ssh_banner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

EXTRA_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "TFRUN_TEST_MARK": "it's got 'quotes' & $dollars"}  # `docker run -e`


# -- playing Docker --------------------------------------------------------------------------------------


def _need(condition: bool, why: str) -> None:
    if not condition:
        pytest.skip(why)


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
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user@laptop", "-f", str(key))
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
        listed = sh("ssh-keygen", "-l", "-f", "/dev/stdin", input=line).stdout.split()
        assert (listed[1], listed[-1].strip("()")) in shown
    check = client.tfrun(*readme_command("tfrun hosts check")[1:])
    lines = check.stdout.splitlines()
    transport = f"ok  transport: socket forwarding to {DOCKERFILE.env['TFRUN_HOME']}/run/tfrund.sock"
    assert transport in lines, check.stdout + check.stderr
    assert all(line.startswith("ok ") for line in lines[: lines.index(transport)]), check.stdout
    # The doctor's checks follow, in the job python: the chroot's python3 lacks the image's TensorFlow, and
    # hosts check says so (a box whose jobs cannot import TensorFlow is not ready: 1, docs/reference/exit-codes.md), and
    # only that fails.
    assert check.returncode == 1, check.stdout + check.stderr
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
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger))
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
