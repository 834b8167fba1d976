"""Checkpoints in object storage on a box shared with another real Unix user (`mallory`, tests/harness/otheruser.py):
the keys never on a command line she can read, and a credentials file of hers never believed, so that she can
neither learn the keys nor have the checkpoints sent to a server of hers."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest
from harness.home import Tfrun, write_script
from harness.otheruser import CommandLineWatch, OtherUser, mallory  # noqa: F401
from harness.processes import wait_for
from harness.s3server import S3Server, s3_fixture  # noqa: F401 - the fixture s3
from test_storage import JOB, _stored

pytestmark = [pytest.mark.s3, pytest.mark.root, pytest.mark.slow]


def test_the_keys_are_on_no_command_line_of_the_box(tmp_path: Path, s3: S3Server, mallory: OtherUser) -> None:  # noqa: F811
    tf = Tfrun(tmp_path / "home")
    tf.env.update(s3.write_aws_files(tmp_path / "aws"))
    bucket = f"t-{secrets.token_hex(6)}"
    s3.make_bucket(bucket)
    write_script(tmp_path, "job.py", JOB)
    watch = CommandLineWatch(mallory, s3.secret_key)
    try:
        control = watch.control()
        where = f"s3://{bucket}/c"
        job = str(tf.submit("--workdir", str(tmp_path), "--checkpoints-to", where, str(tmp_path / "job.py"), "2"))
        tf.ok("wait", job)
        _stored(tf, job, 2)
        restored = Tfrun(tmp_path / "other-home", client_home=tmp_path / "other-client")
        restored.env.update(s3.write_aws_files(tmp_path / "aws2"))
        again = restored.ok("restart", json.loads(tf.ok("checkpoints", "--json", job))["place"]).strip()
        restored.ok("wait", again)
        assert "resumed at step 2" in restored.log(again).decode()
        assert watch.seen() == [control], "the watch saw its control, and no command line with the secret"
    finally:
        tf.cleanup()


def test_a_credentials_file_another_user_put_there_is_never_believed(tmp_path: Path, mallory: OtherUser) -> None:  # noqa: F811
    shared = Path(tempfile.mkdtemp(prefix="tfrun-team-", dir="/tmp"))
    shared.chmod(0o1777)  # a team folder, sticky: she may put files in it, and name them as she likes
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    contacts: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                contacts.append(str(listener.accept()[1]))
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    text = (f"[default]\naws_access_key_id = AKMALLORY\naws_secret_access_key = hers\n"
            f"endpoint_url = http://127.0.0.1:{listener.getsockname()[1]}\n")  # fmt: skip
    planted = mallory.python(f"open({str(shared / 'credentials')!r}, 'w').write({text!r})")
    assert planted.returncode == 0, planted.stderr
    tf = Tfrun(tmp_path / "home")
    tf.env.update({"AWS_SHARED_CREDENTIALS_FILE": str(shared / "credentials"),
                   "AWS_CONFIG_FILE": str(shared / "credentials")})  # fmt: skip
    write_script(tmp_path, "job.py", JOB)
    try:
        job = str(tf.submit("--workdir", str(tmp_path), "--checkpoints-to", "s3://ckpt-bucket/c",
                            str(tmp_path / "job.py"), "1"))  # fmt: skip
        tf.ok("wait", job)
        problem = wait_for(lambda: json.loads(tf.ok("checkpoints", "--json", job))["problem"], timeout=60,
                           what="the refusal said")  # fmt: skip
        assert f"{shared / 'credentials'} belongs to another user" in problem
        assert contacts == [], "nothing was sent to the server her file named"
    finally:
        stop.set()
        listener.close()
        tf.cleanup()
        shutil.rmtree(shared, ignore_errors=True)
