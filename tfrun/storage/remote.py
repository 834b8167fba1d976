"""One bucket, through obstore (the Python face of Rust's object_store, chosen by measurement: bench/storage.py
and docs/explanation/performance.md): put a file and verify it, get one and verify it, list, delete. No S3 signing here.

Every failure leaves as a `StorageError`: one line in the user's words (the bucket is missing, the keys were
refused, the server cannot be reached), with the keys masked, whatever the library said.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

from tfrun.duration import parse_duration
from tfrun.shorten import shorten

from .credentials import CredentialsError, Settings, settings_for
from .place import Place

if TYPE_CHECKING:
    from obstore.store import ObjectStore

STORAGE_TIMEOUT_ENV = "TFRUN_STORAGE_TIMEOUT"
DEFAULT_STORAGE_TIMEOUT_S = 60.0
PART_BYTES = 8 << 20  # a file larger than this goes up in parts of this size, several at once
READ_BYTES = 1 << 20  # what is read, hashed and paced at a time (a download's chunk too)
_CODE = re.compile(r"<Code>([^<]{1,64})</Code>")  # S3's error code, in the body the library quotes
_STATUS = re.compile(r"status code: (\d{3})([^:<\n]{0,40})")
_REFUSED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken"}
_TIMED_OUT = re.compile(r"\bTimedOut\b|operation timed out|deadline has elapsed")  # the library's timeout
_UNREACHABLE = re.compile(
    r"connection refused|timed out|dns error|connection reset|no route to host|error sending request", re.IGNORECASE
)

# What a failure is, for the one line and for what the daemon does next (retry, or wait for the user).
UNREACHABLE = "unreachable"
REFUSED = "refused"
NO_BUCKET = "no-bucket"
NOT_FOUND = "not-found"
CHANGED = "changed"
STORAGE_FAILED = "failed"


def request_timeout() -> float:
    """Seconds one request to storage may take (a part of 8 MB, a listing) before it is given up and tried
    again: TFRUN_STORAGE_TIMEOUT, else 60 (a link slower than 140 kB/s needs more). A link that froze without a
    word (a sleeping laptop's, a NAT's that forgot the flow) costs this, not forever."""
    value = (
        parse_duration(os.environ.get(STORAGE_TIMEOUT_ENV, "").strip()) if os.environ.get(STORAGE_TIMEOUT_ENV) else None
    )
    return value if value else DEFAULT_STORAGE_TIMEOUT_S


class StorageError(Exception):
    """A storage operation that failed: `kind` says how, the message says it in one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(frozen=True)
class Uploaded:
    """A file as it was uploaded and verified: its size and SHA-256, for the checkpoint's manifest."""

    size: int
    sha256: str


class Pace:
    """At most `rate` bytes a second on average (0: no bound), across every file this uploader sends: the
    config's `storage.max_bandwidth`, so that uploads leave the box's link to the training's own traffic."""

    def __init__(self, rate: int) -> None:
        self.rate, self._start, self._sent = rate, time.monotonic(), 0

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        self._sent += n
        ahead = self._sent / self.rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)
        elif ahead < -1.0:  # idle for a while: no burst to catch up
            self._start, self._sent = time.monotonic(), 0


class Remote:
    """The bucket and prefix of `place`, opened on first use with the credentials of `settings_for`."""

    def __init__(self, place: Place, parallel: int = 4) -> None:
        self.place, self.parallel = place, max(1, parallel)
        self._store: Optional[ObjectStore] = None
        self._settings: Optional[Settings] = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            try:
                self._settings = settings_for(self.place)
            except CredentialsError as exc:
                raise StorageError(REFUSED, str(exc)) from None
            self._store = self._open(self._settings)
        return self._store

    def _open(self, settings: Settings) -> ObjectStore:
        from obstore.store import from_url

        timeout = request_timeout()
        client: dict[str, Any] = {"connect_timeout": f"{min(10.0, timeout):g}s", "timeout": f"{timeout:g}s"}
        if (settings.endpoint or "").startswith("http://"):
            client["allow_http"] = True
        retry: Any = {"max_retries": 2, "retry_timeout": timedelta(seconds=20)}
        config: dict[str, str] = dict(settings.config)
        if self.place.scheme == "s3":
            config["checksum_algorithm"] = "sha256"  # each request's SHA-256 sent: the server refuses other bytes
        try:
            store = from_url(self.place.url, config=config or None, client_options=client, retry_config=retry)  # type: ignore[call-overload]
            return store  # type: ignore[no-any-return]
        except Exception as exc:  # the library's configuration errors: a bad endpoint, region, ...
            raise self._error(exc) from None

    def put_file(self, key: str, path: str, pace: Optional[Pace] = None) -> Uploaded:
        """Upload the file at `path` as `key`, verified: over S3, each request carries the SHA-256 of its bytes
        (x-amz-checksum-sha256), which the server checks before it keeps them, and the object's size is checked
        after; elsewhere the object is read back and compared. StorageError(CHANGED) if the file changed while
        it was read (the SHA-256 that goes in the manifest is of what was sent)."""
        import obstore

        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise StorageError(CHANGED, f"{path} is no longer a regular file")
            sent = _Sent()
            chunks = _read(f, sent, pace)
            try:
                if before.st_size <= PART_BYTES:
                    obstore.put(self.store, key, b"".join(chunks), use_multipart=False)
                else:
                    obstore.put(self.store, key, chunks, chunk_size=PART_BYTES, max_concurrency=self.parallel)
            except StorageError:
                raise
            except Exception as exc:
                raise self._error(exc) from None
            after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or sent.size != after.st_size:
            raise StorageError(CHANGED, f"{path} changed while it was uploaded")
        self._verify(key, sent)
        return Uploaded(sent.size, sent.sha256.hexdigest())

    def _verify(self, key: str, sent: _Sent) -> None:
        """The object is what was sent: its size; and, where no server checked each request's SHA-256 (Google
        Cloud Storage, Azure: their own checks are not asked for here), its bytes read back and compared."""
        meta = self._call(lambda o: o.head(self.store, key))
        if meta["size"] != sent.size:
            raise StorageError(STORAGE_FAILED, f"{key} was stored with {meta['size']} bytes, not {sent.size}")
        if self.place.scheme == "s3":
            return
        back = hashlib.sha256()
        self._stream(key, back.update)
        if back.hexdigest() != sent.sha256.hexdigest():
            raise StorageError(STORAGE_FAILED, f"{key} read back differs from what was sent")

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(lambda o: o.put(self.store, key, data, use_multipart=False))

    def get_bytes(self, key: str) -> bytes:
        return bytes(self._call(lambda o: o.get(self.store, key).bytes()))

    def get_into(self, key: str, f: Any, size: int, sha256: str) -> None:
        """Write object `key` into the open file `f`; StorageError unless its size and SHA-256 are those given."""
        got, counted = hashlib.sha256(), [0]

        def take(chunk: Any) -> None:
            view = memoryview(chunk)
            got.update(view)
            f.write(view)
            counted[0] += len(view)

        self._stream(key, take)
        n = counted[0]
        if n != size or got.hexdigest() != sha256:
            raise StorageError(
                STORAGE_FAILED, f"{self.place.child(key)} came back unlike it was stored ({n} of {size} bytes)"
            )

    def listing(self, prefix: str = "") -> dict[str, int]:
        """Every key under `prefix`, with its size."""
        listed = self._call(
            lambda o: [m for batch in o.list(self.store, prefix or None, chunk_size=1000) for m in batch]
        )
        return {meta["path"]: meta["size"] for meta in listed}

    def _stream(self, key: str, take: Callable[[Any], None]) -> None:
        """Hand each chunk of object `key` to `take` as it arrives (a failure midway is a StorageError too)."""

        def work(o: Any) -> None:
            for chunk in o.get(self.store, key).stream(min_chunk_size=READ_BYTES):
                take(chunk)

        self._call(work)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            self._delete_batch(keys[start : start + 1000])

    def _delete_batch(self, batch: list[str]) -> None:
        self._call(lambda o: o.delete(self.store, batch))

    def _call(self, work: Callable[[Any], Any]) -> Any:
        import obstore

        try:
            return work(obstore)
        except StorageError:
            raise
        except Exception as exc:
            raise self._error(exc) from None

    def _error(self, exc: BaseException) -> StorageError:
        """The library's error as one line: what happened, in the user's words, and where."""
        text = str(exc)
        for secret in self._settings.secrets if self._settings else ():
            text = text.replace(secret, "***")
        endpoint = self._settings.endpoint if self._settings else None
        where = self.place.url + (f" at {endpoint}" if endpoint else "")
        source = self._settings.source if self._settings else "no credentials"
        code = _CODE.search(text)
        status = _STATUS.search(text)
        no_keys = not (self._settings and self._settings.secrets)
        if no_keys and ("169.254.169.254" in text or "credentials" in text.lower()):  # the role's, looked for
            return StorageError(
                REFUSED,
                f"no credentials for {where} on this machine: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (docs/how-to/checkpoints.md)",
            )
        if (code and code.group(1) == "NoSuchBucket") or "bucket does not exist" in text.lower():
            return StorageError(NO_BUCKET, f"bucket {self.place.bucket} does not exist ({where}): make it, fix the URL")
        if (code and code.group(1) in _REFUSED_CODES) or (status and status.group(1) in ("401", "403")):
            return StorageError(REFUSED, f"{where} refused the credentials ({source}): check them on this machine")
        if type(exc).__name__ == "NotFoundError" or (code and code.group(1) == "NoSuchKey"):
            return StorageError(NOT_FOUND, f"not found in {where}")
        if status:
            said = f"{code.group(1)}: " if code else ""
            return StorageError(STORAGE_FAILED, f"{where} answered {status.group(1)} ({said}{status.group(2).strip()})")
        if _TIMED_OUT.search(text):
            return StorageError(UNREACHABLE, f"{endpoint or where} did not answer in {request_timeout():g} s")
        reason = _UNREACHABLE.search(text)
        if reason:
            return StorageError(UNREACHABLE, f"cannot reach {endpoint or where} ({reason.group(0).lower()})")
        return StorageError(STORAGE_FAILED, f"{where}: {_gist(text)}")


class _Sent:
    """What was read of a file for its upload: its SHA-256 and size, for the checkpoint's manifest."""

    def __init__(self) -> None:
        self.sha256, self.size = hashlib.sha256(), 0

    def add(self, data: bytes) -> None:
        self.sha256.update(data)
        self.size += len(data)


def _read(f: Any, sent: _Sent, pace: Optional[Pace]) -> Iterator[bytes]:
    while True:
        data = f.read(READ_BYTES)
        if not data:
            return
        sent.add(data)
        if pace is not None:
            pace.take(len(data))
        yield data


def _gist(text: str) -> str:
    """The library's message on one line, cut: its first line, without the request it was answering."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), text)
    line = re.sub(r"^Generic \w+ error: ", "", line)
    return shorten(line, 160)
