"""A job resumed on another box from its checkpoints in object storage (issue 48, docs/how-to/checkpoints.md): two boxes
behind the tests' real sshd (two daemons, two TFRUN_HOMEs), a real S3 server, and then the first box gone;
and a Keras job of tfrun.jobs resumed exactly, weights and counters, by a daemon that never ran it."""

from __future__ import annotations

import getpass
import json
import secrets
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from harness.home import Tfrun, write_script
from harness.s3server import S3Server, s3_fixture  # noqa: F401 - the fixture s3
from harness.sshd import Sshd
from test_storage import JOB, _stored, _verified_in_bucket
from test_training import RESUMABLE, _lines

pytestmark = [pytest.mark.s3, pytest.mark.slow]
DEAD_PORT = 9  # discard: nothing listens on it here, so a box named there cannot be reached


def _boxes(tmp_path: Path, sshd: Sshd, s3: S3Server, box1_port: int, bucket: str) -> Tfrun:
    """A client whose config names box1 and box2 (both pool `gpu`, whose submits store to `bucket`), two daemons
    behind the same sshd, each with a home of its own and the server's credentials where AWS's tools look."""
    client = Tfrun(tmp_path / "client-side", client_home=tmp_path / "client")
    ssh_dir = client.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(sshd.user_key, ssh_dir / "id_ed25519")
    (ssh_dir / "id_ed25519").chmod(0o600)
    (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line.replace(f":{sshd.port}]", f":{box1_port}]")
                                         + sshd.known_hosts_line)  # fmt: skip
    aws = s3.write_aws_files(tmp_path / "aws")
    tfrund = shlex.join([sys.executable, "-m", "tfrun.runner"])
    text = ""
    for name, port in (("box1", box1_port), ("box2", sshd.port)):
        env = {"TFRUN_HOME": str(tmp_path / f"{name}-home"), **aws}
        text += (f'[hosts.{name}]\ndestination = "{getpass.getuser()}@127.0.0.1:{port}"\n'
                 f"tfrund = {json.dumps(tfrund)}\npools = [\"gpu\"]\n"
                 f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n")  # fmt: skip
    text += f'[pools.gpu]\ncheckpoints_to = "s3://{bucket}/m"\n'
    config = client.client_home / ".config" / "tfrun" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    return client


@pytest.mark.ssh
def test_a_job_resumes_on_another_box_and_with_its_box_gone(tmp_path: Path, sshd: Sshd, s3: S3Server) -> None:
    bucket = f"t-{secrets.token_hex(6)}"
    s3.make_bucket(bucket)
    project = tmp_path / "project"
    project.mkdir()
    write_script(project, "job.py", JOB)
    client = _boxes(tmp_path, sshd, s3, sshd.port, bucket)
    homes = [tmp_path / "box1-home", tmp_path / "box2-home"]
    try:
        # to the pool, whose [pools.gpu] checkpoints_to names the bucket: placed on box1 (both idle: by name)
        address = client.ok("submit", "--host", "gpu", "--workdir", str(project), "--env", "TOKEN=tok-1",
                            str(project / "job.py"), "2").strip()  # fmt: skip
        assert address.startswith("box1:")
        first = address.split(":")[1]
        client.ok("wait", f"box1:{first}")
        place = _stored(client, f"box1:{first}", 2)["place"]
        assert place.startswith(f"s3://{bucket}/m/job-")

        # box1 answers: the job's stored folder and its env come from it
        moved = client.ok("restart", f"box1:{first}", "--host", "box2").strip()
        assert moved.startswith("box2:")
        client.ok("wait", moved)
        log = client.ok("logs", moved)
        assert "resumed at step 2" in log and "TOKEN=tok-1 AWS=None" in log and "step 4 loss=0.2500" in log
        assert client.job(moved)["checkpoints_to"] == place  # it goes on storing where the job stored
        reply = _stored(client, moved, 4)
        assert {c["name"]: (c["on_box"], c["storage"]) for c in reply["checkpoints"]} == {
            "state-1.json": (False, "stored"),  # stored by box1 only
            "state-2.json": (True, "stored"),  # restored here before the script started
            "state-3.json": (True, "stored"),
            "state-4.json": (True, "stored"),
        }

        # box1 is gone: what this machine remembered of the job is enough
        gone = _boxes(tmp_path, sshd, s3, DEAD_PORT, bucket)
        gone.env.update(s3.write_aws_files(tmp_path / "client-aws"))  # this machine's own keys read the bucket
        shown = gone.run("checkpoints", f"box1:{first}")
        assert shown.returncode == 0, shown.stderr
        assert f"box1 cannot be reached; reading {place}" in shown.stderr
        assert "state-4.json" in shown.stdout and f"stored in {place}: 4 of 4" in shown.stdout
        pulled = gone.run("pull", f"box1:{first}", "--to", str(tmp_path / "pulled"))
        assert pulled.returncode == 0, pulled.stderr
        copies = sorted(p.name for p in (tmp_path / "pulled" / "checkpoints").iterdir())
        assert copies == ["state-1.json", "state-2.json", "state-3.json", "state-4.json"]
        assert json.loads((tmp_path / "pulled" / "checkpoints" / "state-4.json").read_text())["step"] == 4
        again = gone.run("restart", f"box1:{first}", "--host", "gpu")  # the pool: never box1
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip().startswith("box2:") and "--env values are never stored" in again.stderr
        gone.ok("wait", again.stdout.strip())
        log = gone.ok("logs", again.stdout.strip())
        assert "resumed at step 4" in log and "TOKEN=None" in log
        _stored(gone, again.stdout.strip(), 6)
        assert sorted(_verified_in_bucket(s3, place)) == [f"state-{n}.json" for n in range(1, 7)]
    finally:
        for home in homes:
            Tfrun(home).cleanup()


@pytest.mark.tensorflow
def test_a_keras_job_resumes_elsewhere_with_the_weights_it_stored(tmp_path: Path, s3: S3Server) -> None:
    bucket = f"t-{secrets.token_hex(6)}"
    s3.make_bucket(bucket)
    project = tmp_path / "project"
    project.mkdir()
    (project / "resumable.py").write_bytes(RESUMABLE.read_bytes())
    aws = s3.write_aws_files(tmp_path / "aws")
    first, second = Tfrun(tmp_path / "a"), Tfrun(tmp_path / "b", client_home=tmp_path / "b-client")
    for tf in (first, second):
        tf.env.update(aws)
    try:
        job = first.submit("--workdir", str(project), "--python", sys.executable, "--checkpoints-to",
                           f"s3://{bucket}/keras", str(project / "resumable.py"), "fit", "5", "20", "1000")  # fmt: skip
        assert first.run("wait", str(job), timeout=300).returncode == 0
        saved = _lines(first.log(job).decode(), "saved")
        reply = _stored(first, str(job), 5, timeout=120)
        stored = _verified_in_bucket(s3, reply["place"])
        # keep=3 deleted nothing that was not stored yet: every save of the five reached the bucket
        assert sorted(stored) == [f"ckpt-{s}" for s in (100, 20, 40, 60, 80)]
        assert all(m["kind"] == "tensorflow" for m in stored.values())
        resumed = second.ok("restart", reply["place"], "--python", sys.executable).strip()
        assert second.run("wait", resumed, timeout=300).returncode == 0
        (start,) = _lines(second.log(resumed).decode(), "start")
        assert start == saved[-1], "the new box began with exactly the weights and counters last stored"
        assert "tfrun: resumed from" in second.log(resumed).decode()
    finally:
        first.cleanup()
        second.cleanup()
