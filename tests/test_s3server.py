"""The S3 server of tests/harness/s3server.py is a real one: it keeps what a client puts with the server's keys,
refuses a wrong secret, and keeps its data across a stop and a start (what an outage test relies on)."""

from __future__ import annotations

import configparser
import stat
from pathlib import Path

import obstore
import pytest
from harness.s3server import S3Server, s3_fixture  # noqa: F401 - the fixture s3

pytestmark = [pytest.mark.s3]


def test_an_object_put_with_the_keys_comes_back(s3: S3Server) -> None:
    s3.make_bucket("roundtrip")
    store = s3.store("roundtrip")
    obstore.put(store, "run/a.txt", b"alpha")
    obstore.put(store, "run/ab/b.bin", bytes(range(256)))
    obstore.put(store, "other/c.txt", b"gamma")
    assert s3.objects("roundtrip", "run/") == {"run/a.txt": b"alpha", "run/ab/b.bin": bytes(range(256))}
    assert s3.objects("roundtrip", "run/a") == {"run/a.txt": b"alpha", "run/ab/b.bin": bytes(range(256))}
    assert set(s3.objects("roundtrip")) == {"run/a.txt", "run/ab/b.bin", "other/c.txt"}
    s3.delete_bucket_contents("roundtrip")
    assert s3.objects("roundtrip") == {}


def test_a_wrong_secret_is_refused(s3: S3Server) -> None:
    s3.make_bucket("refusing")
    obstore.put(s3.store("refusing"), "kept.txt", b"secret data")
    wrong = s3.store("refusing", secret="not-" + s3.secret_key, retries=False)
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        obstore.get(wrong, "kept.txt").bytes()
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        obstore.put(wrong, "written.txt", b"x")
    assert s3.objects("refusing") == {"kept.txt": b"secret data"}


def test_the_aws_files_name_the_server(s3: S3Server, tmp_path: Path) -> None:
    env = s3.write_aws_files(tmp_path / "aws")
    assert env == {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws/credentials"),
                   "AWS_CONFIG_FILE": str(tmp_path / "aws/config")}  # fmt: skip
    env = s3.write_aws_files(tmp_path / "aws", profile="outage", secret="wrong")
    assert env["AWS_PROFILE"] == "outage"
    credentials, config = configparser.ConfigParser(), configparser.ConfigParser()
    credentials.read(env["AWS_SHARED_CREDENTIALS_FILE"])
    config.read(env["AWS_CONFIG_FILE"])
    assert dict(credentials["outage"]) == {"aws_access_key_id": s3.access_key, "aws_secret_access_key": "wrong"}
    assert dict(config["profile outage"]) == {"region": "us-east-1", "endpoint_url": s3.endpoint}
    for name in ("credentials", "config"):
        assert stat.S_IMODE((tmp_path / "aws" / name).stat().st_mode) == 0o600


def test_data_outlives_a_stop_and_a_start(tmp_path: Path) -> None:
    """A server of the test's own (the session's is shared): down, a request fails; up again, the object is
    there, on the same endpoint."""
    server = S3Server(tmp_path / "s3")
    try:
        server.start()
        server.make_bucket("durable")
        obstore.put(server.store("durable"), "state.json", b'{"step": 7}')
        server.stop()
        server.stop()  # idempotent
        with pytest.raises(Exception, match=r"error sending request|Connection refused"):
            obstore.list(server.store("durable", retries=False)).collect()
        server.start()
        assert server.objects("durable") == {"state.json": b'{"step": 7}'}
    finally:
        server.stop()
