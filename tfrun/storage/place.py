"""Where a job's checkpoints are stored: a bucket and a prefix, as `submit --checkpoints-to` and the config take
them (`s3://bucket/some/prefix`), checked here so that a mistake is one line in the user's words before any job
is made. S3 and what speaks its API (MinIO, SeaweedFS, Ceph, R2, GCS's interoperability endpoint) by `s3://`;
Google Cloud Storage by `gs://` and Azure by `az://`, which the library gives for free."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfrun.constants import MAX_STORAGE_URL

SCHEMES = {"s3": "S3 or a server that speaks its API", "gs": "Google Cloud Storage", "az": "Azure Blob Storage"}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")  # S3's and GCS's rule; Azure's containers fit it
_SEGMENT = re.compile(r"[A-Za-z0-9!_.*'()=,+@-]+")  # the characters S3 calls safe in a key (no spaces, no `/`)


def is_url(text: str) -> bool:
    """Whether `text` is written as a storage URL (s3://...), which verbs that take a job take in its place."""
    return text.partition("://")[0] in SCHEMES and "://" in text


class PlaceError(ValueError):
    """A destination that cannot be used, said in the user's words."""


@dataclass(frozen=True)
class Place:
    """A bucket and a prefix in it (no leading or trailing slash; "" for the bucket's top)."""

    scheme: str
    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def child(self, name: str) -> Place:
        """The place `name` (one or more segments) under this one."""
        return Place(self.scheme, self.bucket, f"{self.prefix}/{name}".strip("/"))

    def __str__(self) -> str:
        return self.url


def parse(text: str) -> Place:
    """The place `text` names; PlaceError saying what is wrong with it otherwise."""
    if len(text) > MAX_STORAGE_URL:
        raise PlaceError(f"a storage URL is at most {MAX_STORAGE_URL} characters; this one has {len(text)}")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in SCHEMES:
        known = ", ".join(f"{name}:// ({what})" for name, what in SCHEMES.items())
        raise PlaceError(f"{text!r} is not a storage URL: write s3://BUCKET/PREFIX ({known})")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise PlaceError(f"{bucket!r} is not a bucket name: 3 to 63 lowercase letters, digits, dots and dashes")
    segments = [s for s in prefix.split("/") if s]
    for segment in segments:
        if segment in (".", "..") or not _SEGMENT.fullmatch(segment):
            raise PlaceError(
                f"{segment!r} in {text!r} is not a safe name for a folder in a bucket: use letters, digits and "
                "!_.*'()=,+@- between slashes"
            )
    if segments and segments[0] == ".tfrun":
        raise PlaceError("the prefix may not start with .tfrun: tfrun keeps its manifests under that name")
    return Place(scheme, bucket, "/".join(segments))
