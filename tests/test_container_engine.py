"""The box built by a real container engine and used as the README says (harness/podman.py): Podman builds
container/Dockerfile on a stand-in for the TF image and runs the README's `docker run` line; the user logs in with
the key only, tfrund runs as the box's user and passes the healthcheck, `tfrun hosts check`, `submit` and `logs -f`
work against it, a running job is marked lost and restarted across `podman restart`, `podman stop` gives tfrund its
SIGTERM, and the volumes keep the state and the host key across `rm` and a new `run`.
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

import pytest
from harness import free_port, wait_for
from harness.boxclient import Client
from harness.container import DOCKERFILE, readme_command, sh
from harness.podman import PODMAN, Built, Container, Podman, build_box, standin_image

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.container, pytest.mark.podman, pytest.mark.timeout(1800)]

GRACE_S = 10  # `podman stop`'s and `docker stop`'s default time before SIGKILL


def _run_options(client: Client, port: int, binds: Path) -> list[str]:
    """The README's `docker run` options for Podman on this host: no GPU to ask for, sshd on 127.0.0.1 only,
    the test's key, and folders of the test's own for the README's host paths."""
    words = readme_command("docker run")[2:]
    options: list[str] = []
    while words:
        word = words.pop(0)
        if word == "--gpus":  # Podman 4.3 has no --gpus: a GPU is `--device nvidia.com/gpu=all` (CDI)
            words.pop(0)
            continue
        if word in ("-p", "-e", "-v"):
            value = words.pop(0)
            if word == "-p":
                value = f"127.0.0.1:{port}:{value.rsplit(':', 1)[1]}"
            elif value.endswith("=$(cat ~/.ssh/id_ed25519.pub)"):
                value = value.split("=", 1)[0] + "=" + client.key.with_suffix(".pub").read_text().strip()
            elif value.startswith("/"):
                source, target = value.split(":", 1)
                folder = binds / source.strip("/").replace("/", "_")
                folder.mkdir(parents=True, exist_ok=True)
                value = f"{folder}:{target}"
            options.append(word)
        options.append(value if word in ("-p", "-e", "-v") else word)
    return options


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if os.geteuid() != 0:
        pytest.skip("Podman here runs as root (rootful: no subordinate ids are set up for a user)")
    for tool in ("podman", "runc", "slirp4netns", "debootstrap", "ssh"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (.ci/run installs podman, runc, slirp4netns and uidmap)")
    assert PODMAN is not None
    podman = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield podman
    finally:
        podman.reset()


@pytest.fixture(scope="module")
def image(engine: Podman) -> Built:
    standin_image(engine)
    words = readme_command("docker build")
    return build_box(engine, words[words.index("-t") + 1])


@pytest.fixture(scope="module")
def box(engine: Podman, image: Built, tmp_path_factory: pytest.TempPathFactory) -> tuple[Container, Client]:
    """The README's run line and first steps: `tfrun ssh-config ... --write`, `ssh box true` (which trusts the
    host key that `podman logs` shows), `tfrun hosts check box`."""
    base = tmp_path_factory.mktemp("engine-box")
    home = base / "client"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    key = home / ".ssh" / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user@laptop", "-f", str(key))
    port = free_port()
    container = Container(engine, "box", [], port)
    client = Client(home=home, key=key, box=container)
    container.run_options = _run_options(client, port, base / "srv")
    container.run()
    words = readme_command("tfrun ssh-config")
    words = [re.sub(r"@gpu-host:\d+", f"@127.0.0.1:{port}", w).replace("~/.ssh/id_ed25519", str(key)) for w in words]
    assert client.tfrun(*words[1:]).returncode == 0
    first = client.ssh(*readme_command("ssh box")[2:], strict="accept-new")
    assert "Permanently added" in first.stderr, first.stderr
    shown = re.findall(r"made host key \d+ (SHA256:\S+) tfrun-box \((\w+)\)", container.logs())
    listed = sh("ssh-keygen", "-l", "-f", str(home / ".ssh" / "known_hosts")).stdout.split()
    assert (listed[1], listed[-1].strip("()")) in shown, container.logs()
    return container, client


def test_the_image_builds_with_its_healthcheck_and_reports_its_size(
    image: Built, box: tuple[Container, Client], capsys: pytest.CaptureFixture[str]
) -> None:
    container, _ = box
    healthcheck = container.podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image.tag).stdout
    assert json.loads(healthcheck)["Test"] == ["CMD", *DOCKERFILE.healthcheck], "--format docker keeps HEALTHCHECK"
    config = container.podman.inspect("image", image.tag)["Config"]
    assert config["Entrypoint"] == DOCKERFILE.entrypoint
    assert sorted(config["Volumes"]) == sorted(DOCKERFILE.volumes)
    assert image.size > 100e6, image.size
    with capsys.disabled():
        print(f"\nthe box with Podman: built in {image.seconds:.0f} s, {image.size / 1e6:.0f} MB; "
              f"sshd answers {container.ssh_after:.1f} s after `podman run`")  # fmt: skip


def test_ssh_takes_the_key_only_never_a_password_or_root(box: tuple[Container, Client]) -> None:
    container, client = box
    user = DOCKERFILE.args["TFRUN_USER"]
    assert client.ssh("id", "-un").stdout.strip() == user
    no_key = ["-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"]
    password = subprocess.run([*client.ssh_args(), *no_key, "box", "true"], env=client.env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    assert password.returncode == 255 and "Permission denied (publickey)." in password.stderr, password.stderr
    # Root is refused even holding the key that logs the user in.
    container.exec(
        "sh", "-c", f"install -d -m 0700 /root/.ssh && cp /run/tfrun/authorized_keys/{user} /root/.ssh/authorized_keys"
    )
    as_root = subprocess.run([*client.ssh_args(), "-l", "root", "box", "true"], env=client.env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert as_root.returncode == 255 and "Permission denied (publickey)." in as_root.stderr, as_root.stderr


def test_tfrund_runs_as_the_box_user_under_tini_and_the_healthcheck_passes(box: tuple[Container, Client]) -> None:
    container, _ = box
    table = container.exec("ps", "-eo", "pid=,user:16=,args=").stdout
    rows = [line.split(None, 2) for line in table.splitlines()]
    assert rows[0][0] == "1" and rows[0][2].startswith("/usr/bin/tini --"), table
    daemons = [row for row in rows if "/opt/tfrun/venv/bin/tfrund run" in row[2]]
    assert [row[1] for row in daemons] == [DOCKERFILE.args["TFRUN_USER"]], table
    health = container.podman("healthcheck", "run", container.name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    assert container.state()["Health"]["Status"] == "healthy"


def test_hosts_check_submit_and_follow_against_the_box(box: tuple[Container, Client], tmp_path: Path) -> None:
    _, client = box
    check = client.tfrun(*readme_command("tfrun hosts check")[1:])
    assert "ok  transport: socket forwarding to /var/lib/tfrun/run/tfrund.sock" in check.stdout, check.stdout
    script = tmp_path / "train.py"
    script.write_text(
        "import time\nfor step in range(1, 4):\n    print(f'step {step}', flush=True)\n    time.sleep(0.2)\n"
    )
    words = readme_command("tfrun submit")
    submitted = client.ok(*[str(script) if w.endswith(".py") else w for w in words[1:]])
    job = submitted.strip().splitlines()[-1]
    follow = readme_command("tfrun logs -f")
    follow[follow.index("-f") + 1] = job
    assert client.ok(*follow[1:]).splitlines() == ["step 1", "step 2", "step 3"]
    assert json.loads(client.ok("status", "--host", "box", "--json", job))["state"] == "succeeded"


def test_a_running_job_is_marked_lost_and_restarted_across_podman_restart(
    box: tuple[Container, Client], tmp_path: Path
) -> None:
    container, client = box
    gated = tmp_path / "gated.py"
    gated.write_text(
        "import os, time\nprint('waiting', flush=True)\n"
        "while not os.path.exists('/mnt/data/go'):\n    time.sleep(0.1)\nprint('released', flush=True)\n"
    )
    job = client.ok("submit", "--host", "box", "--max-restarts", "1", str(gated)).strip()
    wait_for(lambda: "waiting" in client.ok("logs", "--host", "box", job), timeout=60, what="the job to start")
    started = time.monotonic()
    container.podman("restart", "--time", str(GRACE_S), container.name, timeout=120)
    container.wait_for_sshd(started)
    status = wait_for(lambda: (s := json.loads(client.ok("status", "--host", "box", "--json", job)))["restarted_as"]
                      and s, timeout=60, what="the lost job's restart")  # fmt: skip
    assert status["state"] == "lost", status
    mounts = container.podman.inspect("container", container.name)["Mounts"]
    (Path(next(m["Source"] for m in mounts if m["Destination"] == "/mnt/data")) / "go").touch()
    assert client.tfrun("wait", "--host", "box", job).returncode == 0
    restarted = str(status["restarted_as"])
    assert client.ok("logs", "--host", "box", restarted).splitlines() == ["waiting", "released"]


def test_podman_stop_gives_tfrund_its_sigterm_within_the_grace_time(box: tuple[Container, Client]) -> None:
    container, _ = box
    socket = container.volume("tfrun-state") / "run" / "tfrund.sock"
    assert socket.is_socket()
    started = time.monotonic()
    container.podman("stop", "--time", str(GRACE_S), container.name, timeout=60)
    took = time.monotonic() - started
    logs = container.logs()
    assert container.state()["ExitCode"] == 0, logs
    assert took < GRACE_S, f"podman stop had to SIGKILL the box ({took:.1f} s)"
    last_boot = logs.rsplit("sshd and tfrund started", 1)[1]
    assert "stopping: SIGTERM to tfrund and sshd" in last_boot
    assert re.search(r"tfrund \(pid \d+\) stopped; running jobs keep running", last_boot), last_boot
    assert not socket.exists(), "tfrund was killed, not stopped: its socket is left behind"


def test_volumes_and_the_host_key_survive_rm_and_a_new_run(box: tuple[Container, Client]) -> None:
    container, client = box
    if not container.state()["Running"]:
        container.podman("start", container.name)
        container.wait_for_sshd(time.monotonic())
    client.ssh("echo kept > ~/note")
    before = {j["id"] for j in json.loads(client.ok("ps", "--host", "box", "--all", "--json"))}
    assert before
    container.podman("stop", "--time", str(GRACE_S), container.name, timeout=60)
    container.podman("rm", container.name)
    container.run()
    again = client.ssh("cat", "~/note", strict="yes")  # the known_hosts line from the first run still matches
    assert again.stdout == "kept\n" and "WARNING" not in again.stderr
    assert "made host key" not in container.logs()
    after = {j["id"] for j in json.loads(client.ok("ps", "--host", "box", "--all", "--json"))}
    assert before <= after
