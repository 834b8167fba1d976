"""`tfrund doctor` and `tfrun doctor`: each line passes or says what to do, on this GPU-less machine and
against a stand-in nvidia-smi (the one part that cannot exist here: there is no GPU or driver)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from harness import TFRUND, Tfrun, local_and_ssh
from harness.otheruser import OtherUser, mallory  # noqa: F401

pytestmark = [pytest.mark.tensorflow]

pytest.importorskip("tensorflow", reason="the doctor checks the job interpreter's TensorFlow")

FAKE_SMI = """#!/bin/sh
# Prints what nvidia-smi prints on a box with two H100s, for the two ways the doctor calls it.
case "$1" in
  --query-gpu=*) for i in 0 1; do echo 'NVIDIA H100 80GB HBM3, 535.104.05, 81559 MiB'; done ;;
  *) echo '| NVIDIA-SMI 535.104.05    Driver Version: 535.104.05    CUDA Version: 12.2     |' ;;
esac
"""


def _checks(output: str) -> dict[str, dict[str, str]]:
    return {check["name"]: check for check in json.loads(output)}


def test_doctor_on_a_cpu_box_warns_but_passes(tf: Tfrun) -> None:
    result = tf.daemon("doctor", "--json", "--python", sys.executable, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = _checks(result.stdout)
    assert checks["tensorflow"]["status"] == "ok" and checks["tensorflow"]["detail"].startswith(tf_version())
    assert checks["NVIDIA driver"]["status"] == "warn" and "--gpus all" in checks["NVIDIA driver"]["advice"]
    assert checks["GPUs seen by TensorFlow"]["status"] == "warn"
    assert checks["checkpoint root"]["status"] == "ok" and "GB free" in checks["checkpoint root"]["detail"]


def tf_version() -> str:
    import tensorflow

    return str(tensorflow.__version__)


@local_and_ssh
def test_doctor_fails_a_job_python_without_tensorflow_and_an_unwritable_checkpoint_root(
    tf: Tfrun, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"  # a real Python that cannot see any installed package
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    (tmp_path / "a-file").write_text("not a folder")
    (tf.home).mkdir(parents=True, exist_ok=True)
    (tf.home / "config.toml").write_text(f'checkpoint_root = "{tmp_path / "a-file" / "checkpoints"}"\n')
    result = tf.run("doctor", "--python", str(bare), timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("FAIL") and "tensorflow: not importable" in line for line in lines), lines
    assert any(line.startswith("FAIL") and "checkpoint root: " in line and "not writable" in line for line in lines)
    assert "Traceback" not in result.stdout + result.stderr


def test_doctor_fails_when_the_driver_sees_gpus_that_tensorflow_does_not(tf: Tfrun, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**tf.env, "PATH": f"{bin_dir}{os.pathsep}{tf.env['PATH']}"}
    tf.env = env
    result = tf.daemon("doctor", "--json", "--python", sys.executable, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    checks = _checks(result.stdout)
    driver = checks["NVIDIA driver"]
    assert driver["status"] == "ok"
    assert driver["detail"] == "driver 535.104.05, CUDA 12.2; 2 GPU(s): NVIDIA H100 80GB HBM3 (81559 MiB); " \
        "NVIDIA H100 80GB HBM3 (81559 MiB)"  # fmt: skip
    seen = checks["GPUs seen by TensorFlow"]
    assert seen["status"] == "fail" and "nvidia-smi sees 2" in seen["detail"] and "CUDA" in seen["advice"]
    assert checks["built with CUDA"]["status"] == "fail", "a CPU-only TensorFlow on a GPU box is a failure"


@pytest.mark.parametrize("tf", [pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)
def test_hosts_check_and_doctor_use_the_hosts_python_and_name_one_with_tensorflow(tf: Tfrun, tmp_path: Path) -> None:
    """The host's `python` has no TensorFlow: `hosts check` fails on it (not only the first job), names an
    interpreter on the box that has it (a conda env under the daemon's ~) and says how to choose it."""
    bare = tmp_path / "bare"  # a real venv, without TensorFlow
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    box_home = tmp_path / "box-home"
    (box_home / "miniconda3" / "envs").mkdir(parents=True)
    with_tf = box_home / "miniconda3" / "envs" / "tf"
    with_tf.symlink_to(sys.prefix)  # this test's own environment, which has TensorFlow
    host = json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"]
    tf.ok("hosts", "add", "box", host["destination"], "--tfrund", host["tfrund"], "--env", f"TFRUN_HOME={tf.home}",
          "--env", f"HOME={box_home}", "--python", str(bare / "bin" / "python"))  # fmt: skip

    check = tf.run("hosts", "check", timeout=300)
    assert check.returncode == 1, check.stdout + check.stderr  # the daemon answered: not 125, as doctor exits
    lines = check.stdout.splitlines()
    assert f"ok  job python: {bare / 'bin' / 'python'}" in lines, lines
    line = next(line for line in lines if "tensorflow:" in line)
    assert line.startswith("FAIL tensorflow: not importable (ModuleNotFoundError"), line
    assert f"{with_tf / 'bin' / 'python'} (TensorFlow {tf_version()})" in line, line
    assert "tfrun hosts add NAME --python PATH" in line, line

    doctor = tf.run("doctor", "--json", timeout=300)  # no --python: the host's
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    checks = _checks(doctor.stdout)
    assert checks["job python"]["detail"] == str(bare / "bin" / "python")
    assert str(with_tf / "bin" / "python") in checks["tensorflow"]["advice"]


_PLANTED = '#!/bin/sh\ntouch {marker}\nexec {python} "$@"\n'  # a Python with TensorFlow, that leaves a mark


@pytest.mark.root
def test_doctor_runs_no_interpreter_another_user_planted(tf: Tfrun, tmp_path: Path, mallory: OtherUser) -> None:  # noqa: F811
    """Mallory plants a Python (this one, with TensorFlow, behind a script that leaves a mark) in a conda envs
    folder the team may write and in a folder of hers on the user's PATH: the doctor's search, run because the
    job interpreter lacks TensorFlow, names both as not run, with why, and runs neither; a venv of the user's
    is still found."""
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    box_home = Path(tempfile.mkdtemp(prefix="tfrun-doctor-home-"))  # under /tmp, where mallory can reach it
    try:
        envs = box_home / "miniconda3" / "envs"
        envs.mkdir(parents=True)
        envs.chmod(0o777)  # the team's envs folder: anyone may add one
        (box_home / ".venv-tf").symlink_to(sys.prefix)  # the user's own, with TensorFlow
        box_home.chmod(0o755)
        marks = {where: tmp_path / f"ran-{where}" for where in ("conda", "path")}
        plant = "import os, sys\nos.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n" \
            "open(sys.argv[1], 'w').write(sys.argv[2])\nos.chmod(sys.argv[1], 0o755)\n"  # fmt: skip
        conda = envs / "evil" / "bin" / "python"
        on_path = mallory.home / "bin" / "python3"
        for where, planted in (("conda", conda), ("path", on_path)):
            script = _PLANTED.format(marker=marks[where], python=sys.executable)
            result = mallory.python(plant, str(planted), script)
            assert result.returncode == 0, result.stderr
        env = {**tf.env, "HOME": str(box_home), "PATH": f"{on_path.parent}:{tf.env['PATH']}"}
        result = subprocess.run([*TFRUND, "doctor", "--json", "--python", str(bare)], env=env, capture_output=True,
                                text=True, timeout=300)  # fmt: skip
    finally:
        shutil.rmtree(box_home, ignore_errors=True)
    assert result.returncode == 1, result.stdout + result.stderr
    checks = _checks(result.stdout)
    assert [path for path, mark in marks.items() if mark.exists()] == [], "a planted interpreter was run"
    skipped = checks["interpreters not run"]
    assert skipped["status"] == "warn", skipped
    assert f"{on_path} ({mallory.home} is owned by uid {mallory.uid})" in skipped["detail"], skipped
    assert f"{conda} ({envs} may be written by others (mode 0777))" in skipped["detail"], skipped
    assert str(box_home / ".venv-tf" / "bin" / "python") in checks["tensorflow"]["advice"], checks["tensorflow"]
