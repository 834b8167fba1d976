"""Alerts end to end: real jobs print real OOM text, diverge, stall, get SIGKILLed; a real daemon stores the
alerts and delivers them through apprise to a real SMTP server (aiosmtpd) and a real HTTP receiver
(apprise's json://) on 127.0.0.1."""

from __future__ import annotations

import datetime
import html
import json
import os
import re
import shutil
import signal
import socketserver
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import Mailbox, Receiver, Tfrun, alive, no_internet, wait_for, write_script

from tfrun.runner.alerts.watch import KEEP_EVERY_S

pytestmark = [pytest.mark.slow]

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent

# Real messages, as the frameworks print them (TensorFlow's come from a live TF job below).
PYTORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process has 20.52 GiB memory in use."
)
PYTORCH_CPU_OOM = (  # issue #16
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 4398046511104 bytes. Error code 12 (Cannot allocate memory)"
)
JAX_OOM = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
    "17179869184 bytes."
)
TF_NOT_A_FAILURE = (
    "2022-06-01 10:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:275] Allocator (GPU_0_bfc) "
    "ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not "
    "a failure, but may mean that there could be performance gains if more memory were available."
)
TF_RETRY = (
    "2022-06-01 10:00:00.000000: E tensorflow/stream_executor/cuda/cuda_driver.cc:802] failed to allocate "
    "22.10G (23730470912 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
)


def configure(tf: Tfrun, *urls: str, alerts: str = "") -> None:
    """The daemon's config.toml, written before the first command starts the daemon."""
    tf.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    tf.home.chmod(0o700)
    (tf.home / "config.toml").write_text(f"notify = {json.dumps(list(urls))}\n[alerts]\n{alerts}")
    no_internet(tf.env)


def alerts_of(tf: Tfrun, job: int | None = None) -> list[dict[str, Any]]:
    return json.loads(tf.ok("alerts", "--json", *([str(job)] if job is not None else [])))  # type: ignore[no-any-return]


def rules_fired(tf: Tfrun, job: int) -> list[str]:
    return [alert["rule"] for alert in alerts_of(tf, job)]


def settled(tf: Tfrun, job: int, rules: int) -> list[dict[str, Any]]:
    """The job's alerts once it has ended and `rules` of them are stored, and a little longer: a second copy
    of anything would have been stored by then."""
    tf.run("wait", str(job))
    wait_for(lambda: len(alerts_of(tf, job)) >= rules, what=f"{rules} alert(s) of job {job}")
    time.sleep(1.0)
    return alerts_of(tf, job)


def printing(*lines: str, code: int = 0) -> str:
    return "import sys, time\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines) + f"sys.exit({code})\n"


# -- OOM ----------------------------------------------------------------------------------------------------


def _keras2_python() -> str | None:
    """TF 2.15 (Keras 2), found as tests/test_training.py finds it: TFRUN_KERAS2_PYTHON or .venv-keras2/."""
    candidate = os.environ.get("TFRUN_KERAS2_PYTHON") or str(ROOT / ".venv-keras2" / "bin" / "python")
    return candidate if os.access(candidate, os.X_OK) else None


# The first fatal line differs by allocator: with oneDNN (on by default on recent x86 CPUs) TensorFlow's CPU
# memory comes from the BFC allocator "mklcpu", which logs its failure before the op's error; the plain "cpu"
# allocator fails silently and the op's RESOURCE_EXHAUSTED comes first. TF_ENABLE_ONEDNN_OPTS picks one.
MKLCPU_FIRST = "Allocator (mklcpu) ran out of memory trying to allocate 1.00TiB"
OP_FIRST = "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[274877906944]"


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("which", "onednn", "first"),
    [
        pytest.param(lambda: sys.executable, "1", MKLCPU_FIRST, id="tf-onednn"),
        pytest.param(lambda: sys.executable, "0", OP_FIRST, id="tf-plain-cpu"),
        pytest.param(_keras2_python, "1", MKLCPU_FIRST, id="tf2.15-onednn"),
    ],
)
def test_a_tensorflow_oom_is_mailed_and_posted_once_with_its_context(
    tf: Tfrun, project: Path, mailbox: Mailbox, receiver: Receiver, which: Any, onednn: str, first: str
) -> None:
    python = which()
    if python is None:
        pytest.skip("no TF 2.15 here: .ci/run makes .venv-keras2 (tensorflow-cpu 2.15)")
    configure(tf, mailbox.url, receiver.url)
    write_script(
        project,
        "big.py",
        "import tensorflow as tf\nprint('step 1 loss=0.9', flush=True)\nprint('step 2 loss=0.8', flush=True)\n"
        "x = tf.zeros([1 << 38])  # 1 TiB: TensorFlow refuses with ResourceExhaustedError\nprint(x.shape)\n",
    )
    job = tf.submit(
        "--name", "bigmodel", "--python", python, "--env", f"TF_ENABLE_ONEDNN_OPTS={onednn}", str(project / "big.py")
    )
    found = settled(tf, job, 2)
    assert [a["rule"] for a in found] == ["oom", "failed"]
    oom = found[0]
    assert "out of memory (TensorFlow)" in oom["summary"] and first in oom["summary"]
    assert f"job {job} (bigmodel)" in oom["summary"]
    wait_for(lambda: len(mailbox.messages) >= 2 and len(receiver.posts) >= 2, what="mail and posts")
    time.sleep(1.0)
    subjects = [subject for subject, _ in mailbox.texts()]
    assert len(subjects) == 2 and subjects[0].startswith("[tfrun oom] job ") and "out of memory" in subjects[0]
    assert subjects[1].startswith("[tfrun failed] job ")
    _, body = mailbox.texts()[0]
    checkpoints = tf.job(job)["checkpoint_dir"]
    assert os.uname().nodename in body and checkpoints in body and f"tfrun logs {job}" in body
    lines = body.splitlines()
    assert lines[lines.index("Last losses (step: loss):") + 1] == "1: 0.9, 2: 0.8"  # the metric context
    # The alert goes out once the chunk holding the first OOM line is read: what follows it in that chunk (an
    # allocator dump of many lines, or the traceback) depends on timing, but it is TensorFlow's allocator talking.
    assert "Last lines of output:" in body and "allocat" in body.split("Last lines of output:")[1]
    assert [" ".join(post["title"].split()) for post in receiver.posts] == [" ".join(s.split()) for s in subjects]
    assert all(d["state"] == "sent" for a in found for d in a["deliveries"])


@pytest.mark.parametrize(
    ("text", "kind"),
    [(PYTORCH_OOM, "PyTorch"), (PYTORCH_CPU_OOM, "PyTorch"), (JAX_OOM, "JAX/XLA"), ("MemoryError", "Python")],
    ids=["pytorch", "pytorch-cpu", "jax", "python"],
)
def test_pytorch_jax_and_python_oom_text(tf: Tfrun, project: Path, receiver: Receiver, text: str, kind: str) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", printing("Traceback (most recent call last):", text, code=1))
    job = tf.submit(str(project / "job.py"))
    found = settled(tf, job, 2)
    assert [a["rule"] for a in found] == ["oom", "failed"]
    assert f"out of memory ({kind})" in found[0]["summary"]


def test_non_fatal_memory_messages_are_not_oom(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", printing(TF_NOT_A_FAILURE, TF_RETRY, "step 1 loss=0.5", "done training"))
    job = tf.submit(str(project / "job.py"))
    assert [a["rule"] for a in settled(tf, job, 1)] == ["done"]


def test_an_oom_printed_again_within_the_cooldown_is_one_alert(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    # The job survives it (it caught the error) and hits it again a second later.
    script = f"import time\nprint({PYTORCH_OOM!r}, flush=True)\ntime.sleep(1.5)\nprint({PYTORCH_OOM!r}, flush=True)\n"
    write_script(project, "job.py", script)
    job = tf.submit(str(project / "job.py"))
    assert [a["rule"] for a in settled(tf, job, 2)] == ["oom", "done"]
    wait_for(lambda: len(receiver.posts) >= 2, what="posts")
    assert len(receiver.posts) == 2


def _memory_cgroup(tmp_path: Path) -> Path:
    """A memory cgroup (v1 or v2) limited to 200 MB that this test may put a daemon into, or skip."""
    name = f"tfrun-test-{uuid.uuid4().hex[:8]}"
    for root, limit_file in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup", "memory.max")):
        group = Path(root) / name
        try:
            group.mkdir()
            (group / limit_file).write_text(str(200 << 20))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    pytest.skip("cannot create a memory cgroup here (needs root and a writable cgroup filesystem)")


def test_a_kill_by_the_kernel_oom_killer_is_an_oom(
    tf: Tfrun, project: Path, receiver: Receiver, tmp_path: Path
) -> None:
    group = _memory_cgroup(tmp_path)
    try:
        configure(tf, receiver.url)
        # The daemon starts in the cgroup: its shims and jobs inherit it, as in a container with a memory limit.
        tf.prefix = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"]
        write_script(project, "hog.py", "print('allocating', flush=True)\nblocks = []\nwhile True:\n"
                     "    blocks.append(bytearray(16 << 20))\n")  # fmt: skip
        job = tf.submit(str(project / "hog.py"))
        found = settled(tf, job, 2)
        assert tf.job(job)["signal"] == signal.SIGKILL
        assert [a["rule"] for a in found] == ["oom", "failed"]
        assert "kernel's OOM killer" in found[0]["summary"]
    finally:
        tf.cleanup()
        tf.prefix = []
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), what="the cgroup to empty")
        group.rmdir()


def test_a_sigkill_without_the_oom_killer_is_a_failure_only(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    job = tf.submit(str(project / "job.py"))
    pid = wait_for(lambda: tf.job(job)["pid"], what="job pid")
    wait_for(lambda: b"up" in tf.log(job), what="output")
    os.kill(pid, signal.SIGKILL)
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["failed"]
    assert "killed by signal 9" in found[0]["summary"]


# -- loss ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)
def test_a_nan_loss_alerts_at_once(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", printing("step 1 loss=0.70", "step 2 loss=0.69", "step 3 loss=nan", code=1))
    job = tf.submit("--no-alert", "failed", str(project / "job.py"))
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["spike"]
    assert "loss is nan at step 3" in found[0]["summary"]


def _curve_job(curve: str) -> str:
    """A job that prints a real recorded loss curve (tests/data/curves) the way a plain training loop does."""
    return f"""\
import json
for line in open({str(DATA / "curves" / curve)!r}):
    record = json.loads(line)
    if "step" in record:
        print(f"step {{record['step']}} loss={{record['loss']:.6f}}", flush=True)
"""


@pytest.mark.parametrize("curve", ["healthy.jsonl", "noisy.jsonl"])
def test_a_healthy_or_noisy_real_loss_curve_raises_no_spike(
    tf: Tfrun, project: Path, receiver: Receiver, curve: str
) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", _curve_job(curve))
    job = tf.submit(str(project / "job.py"))
    assert [a["rule"] for a in settled(tf, job, 1)] == ["done"]
    samples = json.loads(tf.ok("metrics", "--json", str(job)))
    assert len(samples) == sum(1 for line in (DATA / "curves" / curve).open() if '"step"' in line)


def test_a_real_loss_spike_alerts_once_near_where_it_happened(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    lines = (DATA / "curves" / "spike.jsonl").read_text().splitlines()
    spike_at = next(json.loads(line)["spike_at"] for line in lines if "spike_at" in line)
    write_script(project, "job.py", _curve_job("spike.jsonl"))
    job = tf.submit("--no-alert", "done", str(project / "job.py"))
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["spike"]
    step = int(found[0]["summary"].split("loss spike at step ")[1].split(":")[0])
    assert spike_at <= step <= spike_at + 20
    assert "Last losses" in found[0]["body"]


@pytest.mark.parametrize(
    ("run", "says"),
    [
        # keras-io's custom loop: steps restart each epoch and no line says an epoch's length.
        ("custom_loop.diverge", re.compile(r"loss spike at step \d+ \(epoch \d+, step \d+\): ")),
        # Hugging Face's Trainer prints `'loss': '0'` for a NaN step; its grad_norm says NaN.
        ("hf_trainer.nan", re.compile(r"grad_norm is nan at step 40$")),
    ],
)
def test_real_output_replayed_as_a_job_alerts_where_its_lines_say(
    tf: Tfrun, project: Path, receiver: Receiver, run: str, says: re.Pattern[str]
) -> None:
    """The corpus's logs (tests/data/real/) through the daemon, written as the script wrote them: the alert
    names the step, and the line's own epoch and counter where the step is made global."""
    configure(tf, receiver.url)
    (project / "out.log").write_bytes((DATA / "real" / f"{run}.log").read_bytes())
    write_script(project, "job.py", "import sys\nsys.stdout.buffer.write(open('out.log', 'rb').read())\n")
    job = tf.submit("--no-alert", "done", str(project / "job.py"))
    (alert,) = settled(tf, job, 1)
    assert alert["rule"] == "spike" and says.search(alert["summary"]), alert["summary"]


# -- stall, done, lost --------------------------------------------------------------------------------------


def test_a_job_silent_for_the_stall_time_alerts_once(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", "import time\nprint('loading data', flush=True)\ntime.sleep(6)\nprint('go')\n")
    job = tf.submit("--alert", "stall=2s", "--no-alert", "done", str(project / "job.py"))
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["stall"]
    quiet = found[0]["summary"].split("no output for ")[1]
    assert quiet.endswith(" s while it runs") and 2 <= int(quiet.split()[0]) <= 4  # 2 s, and a look or two late
    assert tf.job(job)["alert_rules"] == ["oom", "spike=2", "stall=2s", "failed", "lost"]


def test_a_job_lost_while_the_daemon_was_down_alerts_at_the_next_start(
    tf: Tfrun, project: Path, receiver: Receiver
) -> None:
    configure(tf, receiver.url)
    write_script(project, "job.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    job = tf.submit(str(project / "job.py"))
    wait_for(lambda: b"up" in tf.log(job), what="output")
    shim = tf.shim_pid(job)
    tf.kill_daemon()
    os.kill(shim, signal.SIGKILL)  # the job's supervisor dies while no daemon watches
    wait_for(lambda: not alive(shim), what="shim to die")
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["lost"]
    wait_for(lambda: len(receiver.posts) >= 1, what="post")


# -- delivery -----------------------------------------------------------------------------------------------


def test_an_alert_waits_out_a_mail_server_down_and_a_daemon_restart_and_arrives_once(tf: Tfrun, project: Path) -> None:
    mailbox = Mailbox()  # not started: the mail server is down
    configure(tf, mailbox.url)
    write_script(project, "job.py", printing(PYTORCH_OOM, code=1))
    job = tf.submit("--no-alert", "failed", str(project / "job.py"))
    found = settled(tf, job, 1)
    wait_for(lambda: alerts_of(tf, job)[0]["deliveries"][0]["attempts"] >= 1, what="a failed attempt")
    delivery = alerts_of(tf, job)[0]["deliveries"][0]
    assert delivery["state"] == "pending" and delivery["error"] and found[0]["rule"] == "oom"
    tf.daemon("stop")
    mailbox.start()
    try:
        tf.ok("ps")  # starts the daemon again; its outbox retries what is pending at once
        wait_for(lambda: len(mailbox.messages) >= 1, what="the mail")
        time.sleep(3.0)
        assert len(mailbox.messages) == 1 and "out of memory" in mailbox.texts()[0][0]
        assert alerts_of(tf, job)[0]["deliveries"][0]["state"] == "sent"
    finally:
        mailbox.stop()


def test_a_daemon_killed_after_an_alert_does_not_send_it_again(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    script = f"import time\nprint({PYTORCH_OOM!r}, flush=True)\ntime.sleep(4)\nprint('recovered', flush=True)\n"
    write_script(project, "job.py", script)
    job = tf.submit(str(project / "job.py"))
    wait_for(lambda: len(receiver.posts) >= 1, what="the oom alert")
    tf.kill_daemon()
    assert [a["rule"] for a in settled(tf, job, 2)] == ["oom", "done"]  # the next daemon resumes the watch
    wait_for(lambda: len(receiver.posts) >= 2, what="the done alert")
    time.sleep(1.0)
    assert [post["title"].split("]")[0] for post in receiver.posts] == ["[tfrun oom", "[tfrun done"]


def test_a_delivery_that_keeps_failing_expires_and_says_why(tf: Tfrun, project: Path) -> None:
    configure(tf, Mailbox().url, alerts='expire = "3s"\n')  # nothing ever listens there
    write_script(project, "job.py", printing("done"))
    job = tf.submit(str(project / "job.py"))
    delivery = wait_for(
        lambda: [d for a in alerts_of(tf, job) for d in a["deliveries"] if d["state"] == "expired"], what="expiry"
    )[0]
    assert delivery["attempts"] >= 2 and "127.0.0.1" in delivery["target"] and delivery["error"]
    assert "expired" in tf.ok("alerts", str(job))


def test_a_slack_url_is_accepted_and_its_secrets_never_shown(tf: Tfrun, project: Path) -> None:
    tokens = ("T1JJ3T3L2", "A1BRTD4JD", "TIiajkdnlazkcOXrIdevi7FQ")
    slack = "slack://{}/{}/{}/#training".format(*tokens)
    configure(tf)
    write_script(project, "job.py", printing(PYTORCH_OOM, code=1))
    job = tf.submit("--notify", slack, "--no-alert", "failed", str(project / "job.py"))
    wait_for(lambda: alerts_of(tf, job) and alerts_of(tf, job)[0]["deliveries"][0]["attempts"] >= 1, what="attempt")
    shown = [
        tf.ok("status", "--json", str(job)),
        tf.ok("status", str(job)),
        tf.ok("ps", "-a", "--json"),
        tf.ok("alerts", "--json"),
        tf.ok("alerts", "--verbose"),
        (tf.home / "tfrund.log").read_text(),
        (tf.job_dir(job) / "spec.json").read_text(),
    ]
    db = sqlite3.connect(tf.home / "tfrun.db")
    shown += [json.dumps(row) for row in db.execute("SELECT * FROM jobs")]
    shown += [json.dumps(row) for row in db.execute("SELECT id, job_id, rule, summary, body FROM alerts")]
    shown += [json.dumps(row) for row in db.execute("SELECT target, error FROM deliveries")]
    db.close()
    for text in shown:
        for token in tokens:
            assert token not in text
    record = tf.job(job)
    assert record["notify"] == ["slack://***/***"]
    delivery = alerts_of(tf, job)[0]["deliveries"][0]
    assert delivery["target"] == "slack://***/***" and delivery["state"] == "pending"


@pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)
def test_notify_test_reports_success_and_the_reason_of_a_failure(
    tf: Tfrun, mailbox: Mailbox, receiver: Receiver
) -> None:
    configure(tf, mailbox.url, receiver.url)
    result = tf.run("notify-test")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sent to ") == 2
    wait_for(lambda: mailbox.messages and receiver.posts, what="test messages")
    assert "test message" in mailbox.texts()[0][0]
    down = Mailbox()  # nothing listens on its port
    failed = tf.run("notify-test", down.url)
    assert failed.returncode == 1 and "not sent to mailto://127.0.0.1" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1
    bad = tf.run("notify-test", "nosuchservice://x")
    assert bad.returncode == 2 and "no service called nosuchservice:// in apprise" in bad.stderr


def test_bad_alert_options_are_one_line_errors(tf: Tfrun, project: Path) -> None:
    configure(tf)
    write_script(project, "job.py", "print(1)\n")
    for args, message in (
        (["--alert", "bogus"], "unknown alert rule 'bogus'"),
        (["--alert", "stall=soon"], "stall takes a duration"),
        (["--no-alert", "nope"], "unknown alert rule 'nope'"),
        (["--notify", "nosuchservice://x"], "--notify: no service called nosuchservice://"),
        (["--metric", "loss=(?P<loss>[0-9.]+"], "--metric"),
    ):
        result = tf.run("submit", *args, str(project / "job.py"))
        assert result.returncode != 0 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert tf.jobs() == []


def test_a_bad_daemon_config_is_refused_in_one_line(tf: Tfrun) -> None:
    tf.home.mkdir(mode=0o700, parents=True)
    (tf.home / "config.toml").write_text('[alerts]\nrules = ["oom", "stall=later"]\n')
    result = tf.daemon("run")
    assert result.returncode != 0 and "stall takes a duration" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gpu_memory_above_the_threshold_alerts_once(tf: Tfrun, receiver: Receiver, tmp_path: Path) -> None:
    standin = tmp_path / "nvml.json"
    gib = 1 << 30
    standin.write_text(json.dumps([{"index": 0, "name": "NVIDIA H200", "used": 30 * gib, "total": 141 * gib}]))
    configure(tf, receiver.url, alerts='gpu_memory_for = "1s"\n')
    tf.env["TFRUN_GPU_STANDIN"] = str(standin)
    tf.ok("ps")
    time.sleep(4)
    assert alerts_of(tf) == []  # 21%: nothing
    standin.write_text(json.dumps([{"index": 0, "name": "NVIDIA H200", "used": 135 * gib, "total": 141 * gib}]))
    wait_for(lambda: alerts_of(tf), what="the gpu-memory alert")
    time.sleep(5)
    found = alerts_of(tf)
    assert [a["rule"] for a in found] == ["gpu-memory"] and found[0]["job_id"] is None
    assert "GPU 0 (NVIDIA H200) memory at 96%" in found[0]["summary"]


# -- how a message reads ------------------------------------------------------------------------------------

# A failing job's output: the alert's log tail, with characters that mean something in HTML and in Markdown.
TAIL = [*(f"epoch {i}: loss went down" for i in range(1, 11)), 'a <tag> & "q" *not bold*', "  indented: kept as is"]


def _failing_job(project: Path) -> Path:
    return write_script(project, "job.py", printing("step 1 loss=0.9", "step 2 loss=0.8", *TAIL, code=3))


def _mail_parts(mailbox: Mailbox) -> tuple[list[str], str]:
    """The first mail's text/plain part as lines, and its text/html part."""
    message = mailbox.messages[0]
    plain, markup = message.get_body(preferencelist=("plain",)), message.get_body(preferencelist=("html",))
    assert plain is not None and markup is not None, message.get_content_type()
    return plain.get_content().splitlines(), markup.get_content().replace("\r\n", "\n")


def test_a_failure_mail_keeps_its_lines_in_text_and_html_and_a_json_post_its_newlines(
    tf: Tfrun, project: Path, mailbox: Mailbox, receiver: Receiver
) -> None:
    configure(tf, mailbox.url, receiver.url)
    job = tf.submit(str(_failing_job(project)))
    found = settled(tf, job, 1)
    assert [a["rule"] for a in found] == ["failed"]
    wait_for(lambda: mailbox.messages and receiver.posts, what="the mail and the post")
    tail = ["step 1 loss=0.9", "step 2 loss=0.8", *TAIL]
    plain, markup = _mail_parts(mailbox)
    # text/plain: a line for each line of the message, blank lines between its parts, the output verbatim.
    assert plain[0] == found[0]["summary"] and plain[1] == ""
    assert f"Host: {os.uname().nodename}" in plain and f"Checkpoints: {tf.job(job)['checkpoint_dir']}" in plain
    losses = plain.index("Last losses (step: loss):")
    assert plain[losses + 1 : losses + 3] == ["1: 0.9, 2: 0.8", ""]
    output = plain.index("Last lines of output:")
    assert plain[output - 1] == "" and plain[output + 1 :] == tail
    # text/html: the losses and the output in <pre>, a line each, escaped; every other line a block of its own.
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", markup, re.DOTALL)
    assert blocks == ["1: 0.9, 2: 0.8", "\n".join(html.escape(line) for line in tail)]
    assert "a &lt;tag&gt; &amp; &quot;q&quot; *not bold*" in blocks[1] and "<tag>" not in markup
    assert re.search(r"<p[^>]*><b>Host:</b> [^<]+</p><p[^>]*><b>Job:</b> ", markup)
    # JSON: the message as stored, newlines and all.
    assert receiver.posts[0]["message"].rstrip("\n") == found[0]["body"].rstrip("\n")
    assert '    a <tag> & "q" *not bold*' in receiver.posts[0]["message"].splitlines()


def _browser() -> str | None:
    return next(filter(None, (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))), None)


def _text_rows(png: Path) -> int:
    """How many rows of text a screenshot shows: bands of rows that hold dark pixels, with light rows between."""
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    inked = (pixels[:, :, :3].mean(axis=2) < 0.5).any(axis=1)
    return int(sum(1 for above, row in zip([False, *inked], inked) if row and not above))


def test_the_failure_mail_renders_line_for_line_in_a_browser(
    tf: Tfrun, project: Path, mailbox: Mailbox, tmp_path: Path
) -> None:
    """The HTML part as a person sees it: headless Chromium's screenshot, kept in $TFRUN_TEST_ARTIFACTS (or
    the test's tmp dir) for a look. Collapsed into paragraphs its 22 lines would be a handful of rows."""
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium to render the mail with (.ci/run installs Debian's chromium)")
    configure(tf, mailbox.url)
    job = tf.submit(str(_failing_job(project)))
    settled(tf, job, 1)
    wait_for(lambda: mailbox.messages, what="the mail")
    plain, markup = _mail_parts(mailbox)
    folder = Path(os.environ.get("TFRUN_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page, png = folder / "failure-mail.html", folder / "failure-mail.png"
    page.write_text(f'<!DOCTYPE html><meta charset="utf-8"><body style="margin:16px;background:#fff">{markup}</body>')
    png.unlink(missing_ok=True)
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=900,1000",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, timeout=120, check=True, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    print(f"the failure mail as Chromium shows it: {png}")
    lines = [line for line in plain if line.strip()]
    assert len(lines) >= 20 and _text_rows(png) >= len(lines), (_text_rows(png), len(lines))


def _self_signed(name: str, folder: Path) -> tuple[Path, Path]:
    """A certificate for `name` signed by its own key (cryptography comes with asyncssh)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / f"{name}.pem", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


class SlackStandIn:
    """Slack's webhook server as the daemon reaches it through an HTTPS proxy: a proxy on 127.0.0.1 that
    accepts the CONNECT to hooks.slack.com, ends the TLS itself (a self-signed certificate, so the Slack URL
    says verify=no) and keeps the JSON posted, answering "ok" as Slack does."""

    def __init__(self, folder: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*_self_signed("hooks.slack.com", folder))
        posts: list[dict[str, Any]] = []
        self.posts = posts

        class Tunnel(socketserver.StreamRequestHandler):
            rbufsize = 0  # nothing of the TLS that follows the CONNECT may be read ahead

            def handle(self) -> None:
                target = self.rfile.readline().split()[1].decode()
                while self.rfile.readline().strip():
                    pass
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                with context.wrap_socket(self.request, server_side=True) as tls, tls.makefile("rb") as reader:
                    path = reader.readline().split()[1].decode()
                    headers = {}
                    while line := reader.readline().strip():
                        name, _, value = line.decode().partition(":")
                        headers[name.strip().lower()] = value.strip()
                    body = reader.read(int(headers.get("content-length", 0)))
                    posts.append({"target": target, "path": path, "json": json.loads(body)})
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Tunnel)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TOKENS = ("T1JJ3T3L2", "A1BRTD4JD", "TIiajkdnlazkcOXrIdevi7FQ")


def test_a_slack_alert_is_mrkdwn_with_the_output_in_a_code_block(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    slack = SlackStandIn(tmp_path)
    try:
        configure(tf)
        tf.env.update(HTTPS_PROXY=slack.url, https_proxy=slack.url)
        url = "slack://{}/{}/{}/?verify=no".format(*TOKENS)  # verify=no: the stand-in's own certificate
        job = tf.submit("--notify", url, str(_failing_job(project)))
        settled(tf, job, 1)
        wait_for(lambda: slack.posts, what="the post to Slack")
    finally:
        slack.stop()
    post = slack.posts[0]
    assert post["target"] == "hooks.slack.com:443" and post["path"] == "/services/" + "/".join(TOKENS)
    payload = post["json"]
    assert payload["mrkdwn"] is True
    text = payload["attachments"][0]["text"]
    lines = text.splitlines()
    assert f"*Host:* {os.uname().nodename}" in lines and "*Last lines of output:*" in lines
    # The output in a code block, a line each, with Slack's three escapes (& < >) and nothing else.
    shown = [line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for line in TAIL]
    assert "\n".join(["```", "step 1 loss=0.9", "step 2 loss=0.8", *shown, "```"]) in text


BROKEN_URLS = [  # (URL, what the one-line error must say, what of it must never be shown)
    ("mailto://smtp.example.com?to=ml-team@example.com", "mailto:// needs a sender: add from=ADDRESS", ()),
    ("mailtos://?to=ml-team@example.com", "mailtos:// needs the mail server: mailtos://USER:PASSWORD@", ()),
    ("mailto://alice:hunter2-secret@127.0.0.1?to=ml-team@example.com", "mailto:// has no valid sender", ("hunter2",)),
    ("slack://T1JJ3T3L2/A1BRTD4JD", "slack:// needs three tokens", ("T1JJ3T3L2", "A1BRTD4JD")),
    ("slack://T1JJ3T3L2/A1BRTD4JD/not*a*token", "apprise says: An invalid Slack (third) Token (****)", ("not*a",)),
    ("mailtoo://smtp.example.com", "no service called mailtoo:// in apprise; did you mean mailto://?", ()),
    ("nosuchservice://x", "no service called nosuchservice:// in apprise", ()),
    ("json://", "json:// needs more after the ://", ()),
    ("https://hooks.example.com/services/abc", "write json://HOST/PATH", ()),
    ("smtp.example.com", "not a URL: expected SERVICE://", ()),
]


def test_notify_test_and_submit_say_what_is_wrong_with_a_broken_url(tf: Tfrun, project: Path) -> None:
    configure(tf)
    write_script(project, "job.py", "print(1)\n")
    for url, says, secrets in BROKEN_URLS:
        for result in (tf.run("notify-test", url), tf.run("submit", "--notify", url, str(project / "job.py"))):
            assert result.returncode == 2 and says in result.stderr, (url, result.stderr)
            assert result.stderr.startswith("tfrun: error: ") and len(result.stderr.strip().splitlines()) == 1
            assert not any(secret in result.stderr for secret in secrets), result.stderr
    assert tf.jobs() == []


# -- metrics ------------------------------------------------------------------------------------------------


def test_metrics_of_a_real_keras_fit_are_read_from_its_progress_bar(tf: Tfrun, project: Path) -> None:
    configure(tf)
    write_script(project, "fit.py", (DATA / "keras_fit.py").read_text())
    job = tf.submit("--python", sys.executable, str(project / "fit.py"))
    assert tf.run("wait", str(job)).returncode == 0
    samples = json.loads(tf.ok("metrics", "--json", str(job)))
    # A sample per step with the loss; the epoch's last line adds the validation values at its last step.
    assert samples and all("loss" in s["values"] or "val_loss" in s["values"] for s in samples)
    steps = [s["step"] for s in samples if "loss" in s["values"]]
    assert steps == sorted(set(steps)) and steps[-1] == 27  # 3 epochs of 9 steps
    assert any("val_loss" in s["values"] for s in samples)
    table = tf.ok("metrics", str(job))
    assert "LOSS" in table and "read from the output" in table
    chart = tf.ok("metrics", "--plot", str(job))
    assert "━ loss" in chart and "━ val_loss" in chart and "step 27" in chart
    assert any("\u2801" <= char <= "\u28ff" for char in chart)  # braille dots: the curve
    png = project / "loss.png"
    tf.ok("metrics", "--png", str(png), str(job))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert int.from_bytes(data[16:20], "big") == 1080 and int.from_bytes(data[20:24], "big") == 540  # 9 x 4.5 in
    nothing = tf.run("metrics", "--plot", "-m", "f1", str(job))
    assert nothing.returncode == 1 and f"job {job} has no f1 to plot yet" in nothing.stderr


def test_metrics_json_and_plot_of_a_job_whose_loss_is_named_train_loss(tf: Tfrun, project: Path) -> None:
    """Issue #16: `metrics --json` exited 1 ("no loss to plot yet") after printing its JSON when no sample was
    named loss/val_loss, and `--plot` drew `loss` only, while `top` and the alerts watch `train_loss`. Right
    after `wait` every printed loss is there: the daemon waits for its watch to finish reading the log."""
    configure(tf)
    write_script(project, "loop.py", printing(*(f"step {i} train_loss={1 / i:.3f}" for i in range(1, 6))))
    job = tf.submit(str(project / "loop.py"))
    assert tf.run("wait", str(job)).returncode == 0
    listed = tf.run("metrics", "--json", str(job))
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert [s["values"] for s in json.loads(listed.stdout)][-1] == {"train_loss": 0.2}
    chart = tf.ok("metrics", "--plot", str(job))
    assert "━ train_loss" in chart and "step 5" in chart


def test_metrics_explain_shows_each_line_shape_what_was_read_and_why(tf: Tfrun, project: Path) -> None:
    """Issue #16: `--explain` shows why a loss is missed and where a read one lands, so that a user knows
    when to add --metric, and then sees the pattern at work."""
    configure(tf)
    lines = ["Start of epoch 0", *(f"Training loss (for 1 batch) at step {i}: {2 / (i + 1):.4f}" for i in range(5))]
    lines += [f"batch {i} objective={i / 10}" for i in range(3)]
    write_script(project, "loop.py", printing(*lines))
    job = tf.submit(str(project / "loop.py"))
    assert tf.run("wait", str(job)).returncode == 0
    shown = tf.ok("metrics", "--explain", str(job))
    assert "5x  Training loss (for 1 batch) at step 0: 2.0000" in shown
    assert "read: training_loss=2 at step 0 (epoch 0)" in shown and "from its counter 0" in shown
    assert "3x  batch 0 objective=0.0" in shown and "read: nothing" in shown
    readings = json.loads(tf.ok("metrics", "--explain", "--json", "-n", "1", str(job)))
    assert [(r["line"], r["lines"], r["step"]) for r in readings] == [
        ("Training loss (for 1 batch) at step 0: 2.0000", 5, 0)
    ]
    job = tf.submit("--metric", r"objective=(?P<objective>\S+)", str(project / "loop.py"))
    assert tf.run("wait", str(job)).returncode == 0
    readings = json.loads(tf.ok("metrics", "--explain", "--json", str(job)))
    matched = next(r for r in readings if r["line"].startswith("batch 0"))
    assert matched["values"] == {"objective": 0.0} and "--metric pattern" in matched["why"]
    wrong = tf.run("metrics", "--explain", "--plot", str(job))
    assert wrong.returncode == 2 and "--explain shows lines" in wrong.stderr


@pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)
def test_metrics_written_by_tfrun_jobs_are_preferred(tf: Tfrun, project: Path) -> None:
    configure(tf)
    write_script(
        project,
        "loop.py",
        "from tfrun.jobs.metrics import MetricWriter\nw = MetricWriter()\n"
        "for step in range(1, 6):\n    w.write(step, epoch=1, loss=1.0 / step)\n"
        "    print(f'step {step} loss={1.0 / step:.1f}')\nw.close()\n",
    )
    job = tf.submit("--python", sys.executable, str(project / "loop.py"))
    assert tf.run("wait", str(job)).returncode == 0
    samples = json.loads(tf.ok("metrics", "--json", str(job)))
    assert [s["step"] for s in samples] == [1, 2, 3, 4, 5]
    assert samples[2]["values"] == {"loss": pytest.approx(1 / 3)}  # exact, not the printed 0.3
    assert "written by tfrun.jobs" in tf.ok("metrics", str(job))


def test_a_nan_loss_written_by_tfrun_jobs_is_a_spike(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    configure(tf, receiver.url)
    write_script(
        project,
        "loop.py",
        "from tfrun.jobs.metrics import MetricWriter\nw = MetricWriter()\n"
        "for step, loss in enumerate([0.9, 0.8, float('nan')], start=1):\n    w.write(step, epoch=1, loss=loss)\n"
        "w.close()\nprint('training went on quietly')\n",
    )
    job = tf.submit("--python", sys.executable, str(project / "loop.py"))
    found = settled(tf, job, 2)
    assert [a["rule"] for a in found] == ["spike", "done"]
    assert "loss is nan at step 3" in found[0]["summary"] and "1: 0.9, 2: 0.8, 3: nan" in found[0]["body"]


def test_absurd_numbers_in_a_jobs_output_do_not_stop_its_watch(tf: Tfrun, project: Path, receiver: Receiver) -> None:
    """A job's output and metrics file are input like any other: a 5,000-digit step (past Python's int() limit),
    a step of 10^30 and a time of 1e400 are no metrics, and the NaN after them still alerts."""
    configure(tf, receiver.url)
    absurd_job = """
import os
metrics = os.environ["TFRUN_METRICS_FILE"]
with open(metrics, "w") as f:
    f.write('{"step": 1e400, "loss": 1}\\n{"step": 1000000000000000000000000000000, "loss": 1}\\n')
    f.write('{"step": 2, "loss": 0.5, "time": 1e400, "epoch": -3}\\n')
print("step", "9" * 5000, "loss=0.70", flush=True)
print("step 1000000000000000000000000000000 loss=0.69", flush=True)
with open(metrics, "a") as f:
    f.write('{"step": 3, "loss": NaN}\\n')
"""
    write_script(project, "job.py", absurd_job)
    job = tf.submit("--python", sys.executable, str(project / "job.py"))
    found = settled(tf, job, 2)
    assert [a["rule"] for a in found] == ["spike", "done"]
    assert "loss is nan at step 3" in found[0]["summary"]
    samples = json.loads(tf.ok("metrics", "--json", str(job)))
    assert [s["step"] for s in samples] == [2, 3], samples
    assert samples[0]["epoch"] is None and samples[0]["time"] is None
    assert "Traceback" not in (tf.home / "tfrund.log").read_text()


def test_the_one_tls_context_mail_reuses_has_its_checks_on_at_every_mail() -> None:
    """apprise's SMTP plugin makes a TLS context per mail (30 ms of certificates); tfrun hands it one, made
    once. The plugin turns the checks off on it for a URL that says verify=no: the next mail's must have
    them on again."""
    from apprise.plugins.email import smtp

    from tfrun.runner.alerts import outbox

    outbox._apprise()
    plugin_ssl = vars(smtp)["ssl"]  # the module's own name for ssl, which outbox replaced
    assert isinstance(plugin_ssl, outbox.ReusedContext)
    first = plugin_ssl.create_default_context()
    first.check_hostname = False  # what the plugin does for ?verify=no
    first.verify_mode = ssl.CERT_NONE
    again = plugin_ssl.create_default_context()
    assert again is first
    assert again.verify_mode == ssl.CERT_REQUIRED and again.check_hostname
    assert plugin_ssl.CERT_NONE == ssl.CERT_NONE  # the rest of the module is the module's


def test_metrics_show_every_line_read_though_the_files_take_them_every_few_seconds(
    tf: Tfrun, project: Path, gate: Path
) -> None:
    """The samples read from a log reach its metrics files only every KEEP_EVERY_S (one write for many lines),
    but `tfrun metrics` (and `top`) ask for them: a job that printed a loss, then two more a moment later and
    went quiet shows all three long before the next write would (the deadline is most of KEEP_EVERY_S; the
    watch reads a line in milliseconds)."""
    more, done = gate.with_suffix(".more"), gate.with_suffix(".done")
    wait = "while not os.path.exists({!r}):\n    time.sleep(0.05)\n"
    write_script(project, "job.py", "import os, time\nprint('step 1 loss=1.0', flush=True)\n" + wait.format(str(more))
                 + "print('step 2 loss=0.5', flush=True)\nprint('step 3 loss=0.25', flush=True)\n"
                 + wait.format(str(done)))  # fmt: skip
    job = tf.submit(str(project / "job.py"))
    wait_for(lambda: len(json.loads(tf.ok("metrics", "--json", str(job)))) == 1, timeout=60, what="the first sample")
    more.touch()  # the next two lines come within KEEP_EVERY_S of the first one's write
    wait_for(lambda: len(json.loads(tf.ok("metrics", "--json", str(job)))) == 3, timeout=KEEP_EVERY_S * 0.8,
             what="the next two samples in `tfrun metrics`")  # fmt: skip
    assert [s["step"] for s in json.loads(tf.ok("metrics", "--json", str(job)))] == [1, 2, 3]
    done.touch()
    tf.ok("wait", str(job))
