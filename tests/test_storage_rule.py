"""When a checkpoint is complete (runner/storage/complete.py, the rule docs/how-to/checkpoints.md states), where storage
is (tfrun/storage/place.py), whose credentials are believed (tfrun/storage/credentials.py) and what a manifest read
from a bucket may name (tfrun/storage/stored.py): the parts of issue 48 that need no S3 server. Real files, real
processes holding them open, real modes and owners."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrun.runner.storage.complete import QUIET_S, Looker, on_box
from tfrun.storage import credentials, place, stored

LONG_AGO = 1_000_000_000.0  # a modification time far enough back to have settled


def _write(folder: Path, name: str, data: bytes = b"x" * 100, settled: bool = True) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if settled:
        os.utime(path, (LONG_AGO, LONG_AGO))
    return path


def _names(looker: Looker) -> list[str]:
    return sorted(c.name for c in looker.look())


def test_a_checkpoint_counts_only_once_unchanged_since_the_previous_look(tmp_path: Path) -> None:
    _write(tmp_path, "model.keras")
    looker = Looker(tmp_path)
    assert _names(looker) == []  # first look: nothing to compare with
    assert _names(looker) == ["model.keras"]
    assert _names(looker) == []  # told once
    _write(tmp_path, "model.keras", b"y" * 200)  # saved again: it waits one more look, then is new again
    assert _names(looker) == []
    assert _names(looker) == ["model.keras"]


def test_a_file_written_a_moment_ago_waits_until_it_settled(tmp_path: Path) -> None:
    _write(tmp_path, "weights.h5", settled=False)
    looker = Looker(tmp_path)
    looker.look()
    assert _names(looker) == []  # unchanged, but written less than QUIET_S ago
    time.sleep(QUIET_S + 0.1)
    assert _names(looker) == ["weights.h5"]


def test_a_file_open_for_writing_by_a_process_is_never_complete(tmp_path: Path) -> None:
    path = _write(tmp_path, "model.pt")
    writer = subprocess.Popen([sys.executable, "-c", f"f = open({str(path)!r}, 'ab'); import time; time.sleep(60)"])
    try:
        looker = Looker(tmp_path)
        time.sleep(1)  # the writer has it open
        looker.look()
        assert _names(looker) == []
    finally:
        writer.kill()
        writer.wait()
    assert _names(looker) == ["model.pt"]  # closed, and unchanged: complete


def test_a_reader_does_not_hold_a_checkpoint_back(tmp_path: Path) -> None:
    path = _write(tmp_path, "model.pt")
    reader = subprocess.Popen([sys.executable, "-c", f"f = open({str(path)!r}, 'rb'); import time; time.sleep(60)"])
    try:
        time.sleep(1)
        looker = Looker(tmp_path)
        looker.look()
        assert _names(looker) == ["model.pt"]
    finally:
        reader.kill()
        reader.wait()


def test_a_tensorflow_checkpoint_needs_every_shard_and_the_state_file_naming_it(tmp_path: Path) -> None:
    _write(tmp_path, "ckpt-5.index")
    _write(tmp_path, "ckpt-5.data-00000-of-00002")
    looker = Looker(tmp_path)
    looker.look()
    assert _names(looker) == []  # a shard is missing
    _write(tmp_path, "ckpt-5.data-00001-of-00002")
    _write(tmp_path, "checkpoint", b'model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n')
    looker.look()
    assert _names(looker) == []  # whole, but the state file does not name it yet
    _write(tmp_path, "checkpoint", b'model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-5"\n')
    (found,) = looker.look()  # its files settled long ago: complete once the state file names it
    assert (found.name, found.kind) == ("ckpt-5", "tensorflow")
    assert sorted(f.path for f in found.files) == [
        "ckpt-5.data-00000-of-00002", "ckpt-5.data-00001-of-00002", "ckpt-5.index"
    ]  # fmt: skip


def test_a_tensorflow_checkpoint_without_a_state_file_is_complete_with_its_shards(tmp_path: Path) -> None:
    _write(tmp_path, "sub/weights.index")
    _write(tmp_path, "sub/weights.data-00000-of-00001")
    looker = Looker(tmp_path)
    looker.look()
    assert _names(looker) == ["sub/weights"]


def test_names_that_say_unfinished_and_links_are_never_checkpoints(tmp_path: Path) -> None:
    for name in (".hidden", "model.keras.tmp", "x.part", "y.partial", "z~", "ckpt-3_temp/part-0.data", ".t/a"):
        _write(tmp_path, name)
    secret = _write(tmp_path.parent / "outside", "secret.txt")
    (tmp_path / "link.keras").symlink_to(secret)
    (tmp_path / "linked").symlink_to(secret.parent, target_is_directory=True)
    looker = Looker(tmp_path)
    looker.look()
    assert _names(looker) == []
    assert on_box(tmp_path) == []


def test_a_storage_url_is_checked_in_the_users_words() -> None:
    assert place.parse("s3://my-bucket/ckpt//bert/").url == "s3://my-bucket/ckpt/bert"
    assert place.parse("gs://b-1/x").child("job-1").url == "gs://b-1/x/job-1"
    for bad, said in (
        ("my-bucket/ckpt", "write s3://BUCKET/PREFIX"),
        ("ftp://b/x", "not a storage URL"),
        ("s3://B/x", "not a bucket name"),
        ("s3://ok-bucket/../x", "not a safe name"),
        ("s3://ok-bucket/a b", "not a safe name"),
        ("s3://ok-bucket/.tfrun/x", "may not start with .tfrun"),
        ("s3://ok-bucket/" + "a" * 600, "at most 512 characters"),
    ):
        with pytest.raises(place.PlaceError, match=said):
            place.parse(bad)


def _aws_files(tmp_path: Path, mode: int = 0o600) -> dict[str, str]:
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text("[default]\naws_access_key_id = AKFILE\naws_secret_access_key = SECRETFILE\n"
                     "[lab]\naws_access_key_id = AKLAB\naws_secret_access_key = SECRETLAB\n")  # fmt: skip
    config.write_text("[default]\nregion = eu-west-1\n[profile lab]\nendpoint_url = http://127.0.0.1:9\n")
    creds.chmod(mode)
    config.chmod(0o644)
    return {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": str(config)}


def test_credentials_come_from_where_awss_tools_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in _aws_files(tmp_path).items():
        monkeypatch.setenv(name, value)
    where = place.parse("s3://bucket-a/x")
    found = credentials.settings_for(where)
    assert (found.config["access_key_id"], found.config["region"], found.endpoint) == ("AKFILE", "eu-west-1", None)
    assert found.source == f"profile default in {tmp_path / 'credentials'}"
    assert "SECRETFILE" in found.secrets
    monkeypatch.setenv("AWS_PROFILE", "lab")
    found = credentials.settings_for(where)
    assert (found.config["access_key_id"], found.endpoint) == ("AKLAB", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRETENV")
    assert credentials.settings_for(where).config["access_key_id"] == "AKENV"  # the environment first
    monkeypatch.setenv("AWS_PROFILE", "nosuch")
    with pytest.raises(credentials.CredentialsError, match="profile 'nosuch' is in neither"):
        credentials.settings_for(where)


@pytest.mark.parametrize(("mode", "said"), [(0o620, "may be written by others"), (0o644, "may be read by others")])
def test_a_credentials_file_others_may_write_or_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                mode: int, said: str) -> None:  # fmt: skip
    for name, value in _aws_files(tmp_path, mode).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(credentials.CredentialsError, match=said):
        credentials.settings_for(place.parse("s3://bucket-a/x"))


def test_a_credentials_fifo_is_refused_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "credentials"
    os.mkfifo(fifo, 0o600)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(fifo))
    with pytest.raises(credentials.CredentialsError, match="not a regular file"):
        credentials.settings_for(place.parse("s3://bucket-a/x"))


@pytest.mark.root
def test_a_credentials_file_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    files = _aws_files(tmp_path)
    os.chown(files["AWS_SHARED_CREDENTIALS_FILE"], 65534, 65534)
    for name, value in files.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(credentials.CredentialsError, match="belongs to another user"):
        credentials.settings_for(place.parse("s3://bucket-a/x"))


@pytest.mark.parametrize("path", ["../../.bashrc", "/etc/passwd", "a/../../b", "a//b", ""])
def test_a_manifest_naming_a_path_outside_the_folder_is_refused(path: str) -> None:
    text = (b'{"name": "ckpt-1", "kind": "file", "saved_at": 1, "files": [{"path": "%s", "size": 1, "sha256": "x"}]}'
            % path.encode())  # fmt: skip
    with pytest.raises(ValueError, match="not a path inside a checkpoint folder"):
        stored.Manifest.from_json(text)


STEPS = [("ckpt-1200", 1200), ("sub/weights.03.h5", 3), ("epoch03.keras", 3), ("state-4.json", 4),
         ("model.weights.h5", None), ("final", None)]  # fmt: skip


@pytest.mark.parametrize(("name", "step"), STEPS)
def test_a_checkpoints_step_is_the_number_its_name_ends_with_its_extensions_aside(name: str, step: object) -> None:
    assert stored.step_of(name) == step
