"""Checkpoints in object storage end to end (issue 48, docs/how-to/checkpoints.md): real daemons, real jobs, a real S3
server (SeaweedFS, tests/harness/s3server.py) on 127.0.0.1. What the daemon stored is read back from the bucket as any
S3 client reads it; a checkpoint counts as stored only with its manifest, whose SHA-256s the bytes must match."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from harness.home import Tfrun, write_script
from harness.processes import alive, wait_for
from harness.relay import Relay
from harness.s3server import S3Server, s3_fixture  # noqa: F401 - the fixture s3

pytestmark = [pytest.mark.s3, pytest.mark.slow]

# A job that resumes from the newest state-N.json in its checkpoint folder, then saves one a step (written to a
# temporary name, then renamed into place, as torch.save users and Keras do), each step once gates/N exists
# when a gates folder is given.
JOB = """\
import json, os, sys, time
folder = os.environ["TFRUN_CHECKPOINT_DIR"]
steps, gates = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else None)
done = [json.load(open(os.path.join(folder, n)))["step"] for n in os.listdir(folder)
        if n.startswith("state-") and n.endswith(".json")]
start = max(done, default=0)
print(f"resumed at step {start}" if start else "started fresh", flush=True)
print("TOKEN=%s AWS=%s" % (os.environ.get("TOKEN"), os.environ.get("AWS_SECRET_ACCESS_KEY")), flush=True)
for step in range(start + 1, start + steps + 1):
    while gates and not os.path.exists(os.path.join(gates, str(step))):
        time.sleep(0.05)
    temporary = os.path.join(folder, f"state-{step}.json.tmp")
    with open(temporary, "w") as f:
        json.dump({"step": step, "pad": "x" * 4096}, f)
    os.replace(temporary, os.path.join(folder, f"state-{step}.json"))
    print(f"step {step} loss={1 / step:.4f}", flush=True)
"""


@pytest.fixture
def home(tmp_path: Path, s3: S3Server) -> Any:
    """A daemon's home whose daemon finds the server's credentials where AWS's tools look (files named by the
    environment), a fresh bucket, and the job script in a project folder."""
    tf = Tfrun(tmp_path / "home")
    tf.env.update(s3.write_aws_files(tmp_path / "aws"))
    bucket = f"t-{secrets.token_hex(6)}"
    s3.make_bucket(bucket)
    project = tmp_path / "project"
    project.mkdir()
    write_script(project, "job.py", JOB)
    yield tf, bucket, project
    tf.cleanup()


def _states(tf: Tfrun, job: str) -> dict[str, Any]:
    return json.loads(tf.ok("checkpoints", "--json", job))  # type: ignore[no-any-return]


def _stored(tf: Tfrun, job: str, count: int, timeout: float = 60) -> dict[str, Any]:
    """The job's `checkpoints --json` once `count` checkpoints are stored."""

    def enough() -> Any:
        reply = _states(tf, job)
        return reply if sum(c["storage"] == "stored" for c in reply["checkpoints"]) >= count else None

    return wait_for(enough, timeout=timeout, what=f"{count} checkpoints of job {job} stored")  # type: ignore[no-any-return]


def _verified_in_bucket(s3: S3Server, place: str) -> dict[str, dict[str, Any]]:
    """Each checkpoint whose manifest is in the stored folder `place`, its files' bytes checked against it."""
    bucket, _, prefix = place.removeprefix("s3://").partition("/")
    objects = s3.objects(bucket, prefix + "/")
    manifests = {}
    for key, data in objects.items():
        if key.startswith(f"{prefix}/.tfrun/checkpoints/"):
            manifest = json.loads(data)
            for f in manifest["files"]:
                body = objects[f"{prefix}/{f['path']}"]
                assert (len(body), hashlib.sha256(body).hexdigest()) == (f["size"], f["sha256"]), f["path"]
            manifests[manifest["name"]] = manifest
    return manifests


def test_each_checkpoint_reaches_the_bucket_complete_verified_and_with_no_secret(home: Any, s3: S3Server) -> None:
    tf, bucket, project = home
    tf.env["AWS_SECRET_ACCESS_KEY"] = s3.secret_key  # in the daemon's environment: never the job's
    tf.env["AWS_ACCESS_KEY_ID"] = s3.access_key
    job = tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/runs", "--env", "TOKEN=tok-123",
                    "--name", "plain", str(project / "job.py"), "3")  # fmt: skip
    tf.ok("wait", str(job))
    reply = _stored(tf, str(job), 3)
    place = reply["place"]
    assert place.startswith(f"s3://{bucket}/runs/plain-")
    assert [(c["name"], c["on_box"], c["storage"]) for c in reply["checkpoints"]] == [
        (f"state-{n}.json", True, "stored") for n in (1, 2, 3)
    ]
    manifests = _verified_in_bucket(s3, place)
    assert sorted(manifests) == ["state-1.json", "state-2.json", "state-3.json"]
    prefix = place.removeprefix(f"s3://{bucket}/")
    stored = s3.objects(bucket, prefix + "/")
    assert not any(key.endswith(".tmp") for key in stored)  # a temporary name is never a checkpoint
    record = json.loads(stored[f"{prefix}/.tfrun/job.json"])
    assert record["env_names"] == ["TOKEN"] and "tok-123" not in json.dumps(record)  # names, never values
    log = tf.log(job).decode()
    assert "TOKEN=tok-123 AWS=None" in log  # the daemon's keys are not the job's
    daemon_log = (tf.home / "tfrund.log").read_text()
    assert s3.secret_key not in daemon_log and "Traceback" not in daemon_log


def test_a_storage_outage_loses_no_checkpoint_and_is_said_then_alerted(tmp_path: Path) -> None:
    server = S3Server(tmp_path / "s3")
    server.start()
    tf = Tfrun(tmp_path / "home")
    try:
        tf.env.update(server.write_aws_files(tmp_path / "aws"))
        server.make_bucket("outage")
        project, gates = tmp_path / "project", tmp_path / "gates"
        project.mkdir()
        gates.mkdir()
        write_script(project, "job.py", JOB)
        tf.ok("config", "set", "storage.alert_after", "3s")
        job = str(tf.submit("--workdir", str(project), "--checkpoints-to", "s3://outage/x", str(project / "job.py"),
                            "4", str(gates)))  # fmt: skip
        (gates / "1").touch()
        _stored(tf, job, 1)
        server.stop()
        for step in (2, 3, 4):
            (gates / str(step)).touch()
        tf.ok("wait", job)  # the job is not held up by the storage it cannot reach

        def said() -> Any:
            reply = _states(tf, job)
            return reply if reply["problem"] and reply["failing_since"] else None

        reply = wait_for(said, timeout=60, what="the outage said by tfrun checkpoints")
        assert f"cannot reach {server.endpoint}" in reply["problem"]
        assert {c["name"]: c["storage"] for c in reply["checkpoints"]}["state-4.json"] == "waiting"
        shown = tf.ok("checkpoints", job)
        assert "storage: cannot reach" in shown and "uploads are retried, none is lost" in shown

        def alerted() -> bool:
            return "storage" in {a["rule"] for a in json.loads(tf.ok("alerts", "--json", job))}

        wait_for(alerted, timeout=60, what="the storage alert")
        server.start()
        reply = _stored(tf, job, 4, timeout=120)  # retried with backoff: at most 10 s apart by now
        assert reply["problem"] is None
        assert sorted(_verified_in_bucket(server, reply["place"])) == [f"state-{n}.json" for n in (1, 2, 3, 4)]
        assert "step 4 loss=0.2500" in tf.log(job).decode()
    finally:
        tf.cleanup()
        server.stop()


def test_a_daemon_killed_mid_upload_finishes_it_when_it_starts_again(home: Any, s3: S3Server) -> None:
    tf, bucket, project = home
    tf.ok("config", "set", "storage.max_bandwidth", "8MB")  # 40 MB take 5 s: time to kill it midway
    write_script(project, "big.py", "import os\n"
                 "with open(os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'model.bin'), 'wb') as f:\n"
                 "    f.write(os.urandom(40 << 20))\n")  # fmt: skip
    job = str(tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/k", str(project / "big.py")))
    tf.ok("wait", job)
    pid = tf.daemon_pid()
    before = _read_by(pid)
    # killed once it has read 16 of the 40 MB (2 s of the 5 the paced upload takes): mid-upload, not before it
    wait_for(lambda: _read_by(pid) - before >= 16 << 20, timeout=60, what="the upload to be under way")
    assert not _stored_yet(tf, job), "killed before the upload ended"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="the daemon to die")
    reply = _stored(tf, job, 1, timeout=120)  # the next verb starts a daemon, which sends what was left
    (state,) = reply["checkpoints"]
    assert (state["name"], state["storage"]) == ("model.bin", "stored")
    manifests = _verified_in_bucket(s3, reply["place"])
    assert manifests["model.bin"]["files"][0]["size"] == 40 << 20
    data = (Path(tf.job(job)["checkpoint_dir"]) / "model.bin").read_bytes()
    assert manifests["model.bin"]["files"][0]["sha256"] == hashlib.sha256(data).hexdigest()


def _read_by(pid: int) -> int:
    """Bytes the process has read so far (/proc's rchar): the daemon reads a checkpoint as it uploads it."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _stored_yet(tf: Tfrun, job: str) -> bool:
    return any(c["storage"] == "stored" for c in _states(tf, job)["checkpoints"])


def test_a_file_still_being_written_is_never_uploaded_until_it_is_closed(home: Any, s3: S3Server) -> None:
    tf, bucket, project = home
    gates = project / "gates"
    gates.mkdir()
    write_script(project, "slow.py", "import os, time\n"
                 "path = os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'model.pt')\n"
                 "with open(path, 'wb') as f:\n"
                 "    f.write(b'a' * 1000); f.flush()\n"
                 f"    while not os.path.exists(os.path.join({str(gates)!r}, 'finish')):\n"
                 "        time.sleep(0.05)\n"
                 "    f.write(b'b' * 1000)\n"
                 "print('closed', flush=True)\n"
                 f"while not os.path.exists(os.path.join({str(gates)!r}, 'end')):\n"
                 "    time.sleep(0.05)\n")  # fmt: skip
    job = str(tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/w", str(project / "slow.py")))
    wait_for(lambda: (Path(tf.job(job)["checkpoint_dir"]) / "model.pt").exists(), what="the file to be begun")
    time.sleep(8)  # four looks, the half-written file settled for six seconds: open for writing, so not taken
    assert [key for key in s3.objects(bucket, "w/") if "/.tfrun/" not in key] == []  # the job's record alone
    assert {c["name"]: c["storage"] for c in _states(tf, job)["checkpoints"]} == {"model.pt": "waiting"}
    (gates / "finish").touch()
    wait_for(lambda: "closed" in tf.log(job).decode(), what="the file to be closed")
    reply = _stored(tf, job, 1)
    manifests = _verified_in_bucket(s3, reply["place"])
    assert manifests["model.pt"]["files"][0]["size"] == 2000  # the whole file, never its first half
    (gates / "end").touch()
    tf.ok("wait", job)


def test_a_missing_bucket_or_refused_credentials_is_one_line_and_an_alert(home: Any, s3: S3Server,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    tf, bucket, project = home
    job = str(tf.submit("--workdir", str(project), "--checkpoints-to", "s3://no-such-bucket-here/x",
                        str(project / "job.py"), "1"))  # fmt: skip
    tf.ok("wait", job)

    def problem(tf: Tfrun, job: str) -> str:
        found = wait_for(lambda: _states(tf, job)["problem"], timeout=60, what="the problem said")
        return str(found)

    assert problem(tf, job).startswith("bucket no-such-bucket-here does not exist")
    shown = tf.run("checkpoints", job)
    assert shown.returncode == 0 and "Traceback" not in shown.stdout + shown.stderr
    assert "storage: bucket no-such-bucket-here does not exist" in shown.stdout
    wait_for(lambda: "storage" in {a["rule"] for a in json.loads(tf.ok("alerts", "--json", job))},
             timeout=30, what="the storage alert")  # fmt: skip

    wrong = Tfrun(tmp_path / "wrong-home", client_home=tmp_path / "wrong-client")
    try:
        wrong.env.update(s3.write_aws_files(tmp_path / "wrong-aws", secret="not-the-secret"))
        other = str(wrong.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/y",
                                 str(project / "job.py"), "1"))  # fmt: skip
        wrong.ok("wait", other)
        assert "refused the credentials (profile default in" in problem(wrong, other)

        def alerts() -> list[dict[str, Any]]:
            return [a for a in json.loads(wrong.ok("alerts", "--json", other)) if a["rule"] == "storage"]

        found = wait_for(alerts, timeout=30, what="the storage alert")
        assert "not-the-secret" not in json.dumps(found)
        assert "not-the-secret" not in (wrong.home / "tfrund.log").read_text()
        s3.write_aws_files(tmp_path / "wrong-aws")  # the keys fixed: read again at the next try, no restart
        assert _stored(wrong, other, 1, timeout=120)["problem"] is None
    finally:
        wrong.cleanup()


def test_rm_keeps_stored_copies_unless_asked_and_a_folder_not_yet_stored(home: Any, s3: S3Server) -> None:
    tf, bucket, project = home
    first = str(tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/r", str(project / "job.py"),
                          "2"))  # fmt: skip
    tf.ok("wait", first)
    place = _stored(tf, first, 2)["place"]
    said = tf.ok("rm", "--checkpoints", first)
    assert f"its stored copies stay in {place} (--storage removes them)" in said
    assert len(_verified_in_bucket(s3, place)) == 2
    second = str(tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/r", str(project / "job.py"),
                           "2"))  # fmt: skip
    tf.ok("wait", second)
    place = _stored(tf, second, 2)["place"]
    said = tf.ok("rm", "--checkpoints", "--storage", second)
    assert f"removed its stored copies in {place}" in said
    prefix = place.removeprefix(f"s3://{bucket}/")
    assert s3.objects(bucket, prefix + "/") == {}
    assert not Path(tf.job_dir(int(second))).exists()


def test_a_pull_from_storage_lands_as_a_pull_does_never_through_a_link(home: Any, s3: S3Server, tmp_path: Path) -> None:
    tf, bucket, project = home
    job = str(
        tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/p", str(project / "job.py"), "1")
    )
    tf.ok("wait", job)
    place = _stored(tf, job, 1)["place"]
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "checkpoints").symlink_to(elsewhere)
    refused = tf.run("pull", place, "--to", str(dest))
    assert refused.returncode == 1 and f"{dest / 'checkpoints'} is a symbolic link" in refused.stderr
    assert list(elsewhere.iterdir()) == []
    (dest / "checkpoints").unlink()
    pulled = tf.run("pull", place, "--to", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    box = Path(tf.job(job)["checkpoint_dir"]) / "state-1.json"
    assert (dest / "checkpoints" / "state-1.json").read_bytes() == box.read_bytes()


def test_a_link_to_storage_that_freezes_is_given_up_and_the_upload_finishes_once_it_thaws(
    home: Any, s3: S3Server, tmp_path: Path
) -> None:
    tf, bucket, project = home
    relay = Relay(int(s3.endpoint.rsplit(":", 1)[1]))
    try:
        config = Path(tf.env["AWS_CONFIG_FILE"])
        config.write_text(config.read_text().replace(s3.endpoint, f"http://127.0.0.1:{relay.port}"))
        tf.env["TFRUN_STORAGE_TIMEOUT"] = "3s"
        tf.ok("config", "set", "storage.max_bandwidth", "8MB")  # 40 MB take 5 s: the link freezes midway
        write_script(project, "big.py", "import os\n"
                     "with open(os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'model.bin'), 'wb') as f:\n"
                     "    f.write(os.urandom(40 << 20))\n")  # fmt: skip
        job = str(tf.submit("--workdir", str(project), "--checkpoints-to", f"s3://{bucket}/f", str(project / "big.py")))
        tf.ok("wait", job)
        wait_for(lambda: relay.links, timeout=60, what="the upload to connect")
        time.sleep(1)
        relay.freeze_all()
        reply = wait_for(lambda: _states(tf, job)["problem"], timeout=60, what="the frozen link said")
        assert f"http://127.0.0.1:{relay.port} did not answer in 3 s" in str(reply)
        relay.resume()
        manifests = _verified_in_bucket(s3, _stored(tf, job, 1, timeout=120)["place"])
        assert manifests["model.bin"]["files"][0]["size"] == 40 << 20
    finally:
        relay.close()


def test_doctor_says_whether_the_boxs_storage_answers(home: Any, s3: S3Server) -> None:
    tf, bucket, _ = home
    tf.ok("config", "set", "storage.checkpoints_to", f"s3://{bucket}/d")
    found = {c["name"]: c for c in json.loads(tf.run("doctor", "--json").stdout)}
    assert found["object storage"]["status"] == "ok" and "profile default in" in found["object storage"]["detail"]
    tf.ok("config", "set", "storage.checkpoints_to", "s3://no-such-bucket-here/d")
    failed = tf.run("doctor", "--json")
    found = {c["name"]: c for c in json.loads(failed.stdout)}
    assert failed.returncode == 1 and found["object storage"]["status"] == "fail"
    assert found["object storage"]["detail"].startswith("bucket no-such-bucket-here does not exist")


def test_the_boxs_default_destination_applies_unless_a_submit_says_none(home: Any, s3: S3Server) -> None:
    tf, bucket, project = home
    tf.ok("config", "set", "storage.checkpoints_to", f"s3://{bucket}/default")
    stored = tf.submit("--workdir", str(project), "--name", "bert", str(project / "job.py"), "1")
    kept = tf.submit("--workdir", str(project), "--checkpoints-to", "none", str(project / "job.py"), "1")
    assert tf.job(stored)["checkpoints_to"].startswith(f"s3://{bucket}/default/bert-")
    assert tf.job(kept)["checkpoints_to"] is None
    bad = tf.run("submit", "--checkpoints-to", "s3://Bad_Bucket/x", str(project / "job.py"))
    assert bad.returncode == 2 and "'Bad_Bucket' is not a bucket name" in bad.stderr and "Traceback" not in bad.stderr


def test_rm_keeps_a_checkpoint_folder_whose_checkpoints_are_not_stored_yet(home: Any) -> None:
    tf, _, project = home
    job = str(tf.submit("--workdir", str(project), "--checkpoints-to", "s3://no-such-bucket-here/r",
                        str(project / "job.py"), "1"))  # fmt: skip
    tf.ok("wait", job)
    wait_for(lambda: _states(tf, job)["problem"], timeout=60, what="the upload to fail")
    folder = Path(tf.job(job)["checkpoint_dir"])
    said = tf.ok("rm", "--checkpoints", job)
    assert f"its checkpoints stay in {folder}: some are not in object storage yet" in said
    assert (folder / "state-1.json").exists()
