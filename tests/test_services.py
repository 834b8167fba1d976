"""TensorBoard and Jupyter on the box, one command away (issue 20): real TensorBoard and JupyterLab run by the
box's daemon as services, reached over a real sshd on 127.0.0.1 through `tfrun forward`'s tunnel, driven
through their own HTTP and websocket APIs; TensorBoard's page as headless Chromium shows it is kept as an
artifact ($TFRUN_TEST_ARTIFACTS, else the test's tmp dir)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TFRUN, Sshd, Tfrun, remote_client, wait_for, write_script
from harness.otheruser import OtherUser, mallory  # noqa: F401

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

_KERAS_JOB = """
import numpy as np, tensorflow as tf
from tfrun.jobs.callback import TfrunCallback
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile("sgd", "mse")
x = np.random.default_rng(0).random((64, 4)).astype("float32")
model.fit(x, x.sum(axis=1, keepdims=True), epochs=3, validation_split=0.25, verbose=2,
          callbacks=[TfrunCallback(tensorboard=True)])
"""
_PLAIN_JOB = "for epoch in range(1, 5):\n    print(f'Epoch {epoch}, Avg Loss: {4.0 / epoch:.4f}')\n"


@pytest.fixture
def box(tf: Tfrun, sshd: Sshd) -> Iterator[Tfrun]:
    """A client reaching its daemon through the real sshd; the daemon's job interpreter has TensorFlow,
    TensorBoard and JupyterLab (this venv's Python)."""
    remote_client(tf, sshd)
    tf.ok("config", "set", "job_python", sys.executable)
    yield tf
    for job in tf.jobs():  # services still up (a failed assertion): stopped, not left to the next test
        if job.get("service") and job["state"] in ("queued", "running"):
            tf.run("stop", str(job["id"]))


def _get(url: str, **kw: Any) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, **kw), timeout=30) as answer:
        return json.loads(answer.read())


def _forward(tf: Tfrun, box_port: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([*TFRUN, "forward", str(box_port), "0", "--json"], env=tf.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    return proc, int(json.loads(line)["local_port"])


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.tensorflow
def test_tensorboard_shows_a_keras_job_and_a_plain_script_side_by_side(
    box: Tfrun, project: Path, tmp_path: Path
) -> None:
    keras = box.submit("--name", "keras", "--python", sys.executable, str(write_script(project, "fit.py", _KERAS_JOB)))
    plain = box.submit("--name", "plain", str(write_script(project, "plain.py", _PLAIN_JOB)))
    for job in (keras, plain):
        assert box.run("wait", str(job), timeout=300).returncode == 0, box.run("logs", str(job)).stdout
    started = json.loads(box.ok("tensorboard", str(keras), str(plain), "--detach", "--json"))
    assert started["kind"] == "tensorboard" and started["name"] == "tensorboard" and not started["reused"]
    again = json.loads(box.ok("tensorboard", str(keras), str(plain), "--detach", "--json"))
    assert again["reused"] and again["id"] == started["id"], "the same runs: the one running is reused"
    forward, port = _forward(box, started["box_port"])
    try:
        base = f"http://127.0.0.1:{port}"
        runs = wait_for(lambda: sorted(_get(f"{base}/data/runs")) if len(_get(f"{base}/data/runs")) >= 4 else None,
                        timeout=60, what="TensorBoard to load the runs")  # fmt: skip
        assert runs == [f"{keras}-keras/printed", f"{keras}-keras/train", f"{keras}-keras/validation",
                        f"{plain}-plain/printed"], runs  # fmt: skip
        tags = _get(f"{base}/data/plugin/scalars/tags")
        assert "epoch_loss" in tags[f"{keras}-keras/train"], tags
        printed = _get(f"{base}/data/plugin/scalars/scalars?run={plain}-plain/printed&tag=avg_loss")
        assert [(step, round(value, 4)) for _, step, value in printed] == [(1, 4.0), (2, 2.0), (3, 1.3333), (4, 1.0)]
        png = _screenshot(f"{base}/#scalars", tmp_path)
        assert png.stat().st_size > 20_000, "a page with charts, not a blank one"
    finally:
        _ended(forward)
    listed = json.loads(box.ok("services", "--json"))
    assert [(s["name"], s["state"], s["port"]) for s in listed] == [("tensorboard", "running", started["box_port"])]
    assert listed[0]["alert_rules"] == ["oom", "failed", "lost"], "no stall or spike alerts for a server"
    assert [j["id"] for j in json.loads(box.ok("ps", "--json"))] == [], "ps lists jobs, not services"
    assert [j["id"] for j in json.loads(box.ok("ps", "--services", "--json"))] == [started["id"]]
    assert box.ok("stop", "tensorboard") == f"stopped tensorboard (job {started['id']})\n"
    assert json.loads(box.ok("services", "--json")) == []
    again = box.run("restart", "tensorboard")
    assert (again.returncode, again.stderr) == (2, "tfrun: error: tensorboard is a service: start it again with "
                                                   "tfrun tensorboard\n")  # fmt: skip
    refused = box.run("stop", str(plain))
    assert (refused.returncode, refused.stderr) == (
        2,
        f"tfrun: error: {plain} is job {plain}, not a service: tfrun cancel {plain}\n",
    )


def _screenshot(url: str, tmp_path: Path) -> Path:
    """TensorBoard's page as headless Chromium renders it, kept for a person to look at."""
    browser = next(filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))), None)
    if browser is None:
        pytest.skip("no chromium for the screenshot (.ci/run installs Debian's chromium)")
    folder = Path(os.environ.get("TFRUN_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "tensorboard.png"
    png.unlink(missing_ok=True)
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,900",
         "--virtual-time-budget=15000", f"--screenshot={png}", url],
        capture_output=True, timeout=180, check=True, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    print(f"TensorBoard as Chromium shows it: {png}")
    return png


def test_tensorboard_attached_stops_its_service_at_ctrl_c(box: Tfrun, project: Path) -> None:
    job = box.submit(str(write_script(project, "plain.py", _PLAIN_JOB)))
    box.ok("wait", str(job))
    proc = subprocess.Popen([*TFRUN, "tensorboard", str(job), "--port", "0"], env=box.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/"), url
    assert _get(f"{url}data/runs") is not None
    code, err = _ended(proc)
    assert code == 130 and "stopped tensorboard" in err, err
    assert json.loads(box.ok("services", "--json")) == []


_TAKE_PORT = r"""
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
end = time.monotonic() + 60
while True:  # the service's port, as soon as its process let it go
    try:
        server.bind(("127.0.0.1", int(sys.argv[1])))
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.05)
server.listen()
print("bound", flush=True)
while True:  # until killed: each connection that reaches it, and what it was sent
    client, _ = server.accept()
    client.settimeout(2)
    try:
        print("got", repr(client.recv(65536)), flush=True)
    except OSError:
        print("got a connection", flush=True)
"""


@pytest.mark.root
def test_a_forward_to_an_ended_service_reaches_no_one(box: Tfrun, project: Path, mallory: OtherUser) -> None:  # noqa: F811
    """TensorBoard is forwarded, then stopped; mallory binds its port on the box at once. The forward, still
    running, asks the box's daemon before each connection and tunnels none to her: she gets nothing."""
    job = box.submit(str(write_script(project, "plain.py", _PLAIN_JOB)))
    box.ok("wait", str(job))
    started = json.loads(box.ok("tensorboard", str(job), "--detach", "--json"))
    forward, port = _forward(box, started["box_port"])
    squatter = None
    try:
        assert _get(f"http://127.0.0.1:{port}/data/runs") is not None, "forwarded while it serves"
        assert box.ok("stop", "tensorboard") == f"stopped tensorboard (job {started['id']})\n"
        squatter = mallory.popen([sys.executable, "-c", _TAKE_PORT, str(started["box_port"])], stdout=subprocess.PIPE)
        assert squatter.stdout is not None and squatter.stdout.readline() == "bound\n"
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs?token=secret", timeout=30)
    finally:
        code, err = _ended(forward)
        if squatter is not None:
            squatter.kill()
    received, _ = squatter.communicate(timeout=30)
    assert received == "", f"the forward reached another user's listener: {received}"
    box_port, job_id = started["box_port"], started["id"]
    assert code == 130 and err == (
        f"tfrun: a connection to box port {box_port} failed: tensorboard (job {job_id}) is cancelled, not serving "
        f"port {box_port}: nothing was forwarded; start it again with tfrun tensorboard\n"
    ), err


@pytest.mark.tensorflow
def test_jupyter_runs_code_and_outlives_its_daemon(box: Tfrun, tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    started = json.loads(box.ok("jupyter", "--dir", str(notebooks), "--detach", "--json"))
    assert started["kind"] == "jupyter" and started["path"].startswith("/?token=")
    token = started["path"].removeprefix("/?token=")
    forward, port = _forward(box, started["box_port"])
    try:
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/api/contents?token={token}")["path"] == ""
        with pytest.raises(urllib.error.HTTPError):
            _get(f"{base}/api/contents")  # no token, no access
        kernel = _get(f"{base}/api/kernels?token={token}", method="POST", data=b"{}")["id"]
        assert _execute(f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}", "print(2+2)") == "4\n"
        box.kill_daemon()
        assert _get(f"{base}/api/status?token={token}")["kernels"] == 1, "Jupyter answers with no daemon"
        listed = json.loads(box.ok("services", "--json"))  # a new daemon, reconciled with what runs
        assert [(s["name"], s["state"]) for s in listed] == [("jupyter", "running")]
        assert _execute(f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}", "print(6*7)") == "42\n"
        # A notebook's GPU OOM, the commonest of all: TensorFlow refuses a tensor too big in the kernel, and the
        # service's alerts see what it logs, as for a job (here on the CPU: 1 TiB).
        big = "import tensorflow as tf\ntry:\n    tf.zeros([1 << 38])\nexcept Exception as e:\n"
        big += "    print(type(e).__name__)"
        assert _execute(f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}", big) == (
            "ResourceExhaustedError\n"
        )
        alerts = wait_for(lambda: json.loads(box.ok("alerts", "jupyter", "--json")), timeout=60, what="an oom alert")
        assert [a["rule"] for a in alerts] == ["oom"] and "out of memory (TensorFlow)" in alerts[0]["summary"], alerts
    finally:
        _ended(forward)
    box.ok("stop", "jupyter")


def _execute(url: str, code: str) -> str:
    """Run `code` in the kernel through Jupyter's websocket (messaging protocol 5.3); what it printed to stdout."""
    import websocket

    ws = websocket.create_connection(url, timeout=60)
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        printed = ""
        while True:
            reply = json.loads(ws.recv())
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if reply["msg_type"] == "stream" and reply["content"]["name"] == "stdout":
                printed += reply["content"]["text"]
            if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                return printed
    finally:
        ws.close()


def test_without_jupyter_it_says_how_to_get_one(box: Tfrun, tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    box.ok("config", "set", "job_python", str(bare / "bin" / "python"))
    result = box.run("jupyter", "--detach")
    assert result.returncode == 2 and result.stderr.startswith("tfrun: error: Jupyter is not installed for the job "
                                                                "interpreter"), result.stderr  # fmt: skip
    assert "pip install jupyterlab" in result.stderr and len(result.stderr.splitlines()) == 1
    result = box.run("tensorboard", "--detach")
    assert result.returncode == 2 and "no jobs to show (none made in the last 1d)" in result.stderr, result.stderr
