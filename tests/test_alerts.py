"""Alerts end to end, what fires: real jobs print real OOM text, diverge, stall, get SIGKILLed; a real daemon stores
the alerts and delivers them through apprise to a real SMTP server (aiosmtpd) and a real HTTP receiver (apprise's
json://) on 127.0.0.1. How they are delivered is in test_alert_delivery.py, how they read in
test_alert_messages.py, the metrics a job's output gives in test_metrics_end_to_end.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Mailbox, Receiver, Tfrun, alive, local_and_ssh, wait_for, write_script
from harness.alerting import PYTORCH_OOM, configure, printing, settled
from harness.paths import DATA, REPO

from tfrun.protocol.fields import JobState
from tfrun.runner.alerts.jobwatch import LOOK_READ_BYTES, keep
from tfrun.runner.alerts.outbox import Outbox
from tfrun.runner.alerts.watch import Alerts
from tfrun.runner.config.settings import Config
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.records.lifecycle import Lifecycle
from tfrun.runner.records.store import Store

pytestmark = [pytest.mark.slow]


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


# -- OOM ----------------------------------------------------------------------------------------------------


def _keras2_python() -> str | None:
    """TF 2.15 (Keras 2), found as tests/test_training.py finds it: TFRUN_KERAS2_PYTHON or .venv-keras2/."""
    candidate = os.environ.get("TFRUN_KERAS2_PYTHON") or str(REPO / ".venv-keras2" / "bin" / "python")
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


@local_and_ssh
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
    assert tf.job(job)["alert_rules"] == ["oom", "spike=2", "stall=2s", "failed", "lost", "storage"]


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


# -- one look at a time (no daemon) -----------------------------------------------------------------------


@pytest.fixture
def looks(tmp_path: Path) -> Iterator[tuple[Lifecycle, Alerts]]:
    """A database of its own, and an alert watch over it whose looks a test makes one at a time."""
    store = Store(tmp_path / "tfrun.db")
    config = Config(checkpoint_root=tmp_path / "checkpoints")
    try:
        yield (Lifecycle(store, tmp_path / "jobs", lambda: config.checkpoint_root),
               Alerts(config, store, Outbox(store, config.cooldown, config.expire)))  # fmt: skip
    finally:
        store.close()


def _running(lifecycle: Lifecycle, name: str) -> JobRow:
    spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={})
    return lifecycle.start(lifecycle.create(name, spec), pid=None, shim_pid=None, shim_start=None, boot_id=None,
                           started_at=1.0)  # fmt: skip


def test_a_look_at_a_backlog_reads_a_budget_of_it_and_the_looks_after_it_read_every_line(
    looks: tuple[Lifecycle, Alerts],
) -> None:
    """One look of the alert watch reads at most LOOK_READ_BYTES of a job's log and leaves the job behind (the watch
    gives the event loop back between looks); the looks after it read the rest, and each line is one sample in
    order, wherever a piece of a look cut it. Before, a look read up to 8 MB in one go: seconds for a log written
    in a tight loop, with no request answered meanwhile."""
    lifecycle, watch = looks
    row = _running(lifecycle, "flood")
    lines = 60_000  # 1.6 MB: several looks' worth
    log = b"".join(b"step %d loss=%.6f\n" % (i, 1 / (i + 1)) for i in range(lines))
    Path(row.job_dir, "output.log").write_bytes(log)
    watch._look(row, whole=False)
    assert 0 < watch._watches[row.id].offset <= LOOK_READ_BYTES and row.id in watch._behind
    made = 1
    while row.id in watch._behind:
        watch._behind.clear()
        watch._look(row, whole=False)
        made += 1
    assert made >= len(log) / LOOK_READ_BYTES
    keep(watch._watches[row.id])
    kept = [json.loads(line) for line in Path(row.job_dir, "logmetrics.jsonl").read_text().splitlines()]
    assert [sample["step"] for sample in kept] == list(range(lines))
    assert [sample["loss"] for sample in kept[-2:]] == [round(1 / (lines - 1), 6), round(1 / lines, 6)]


def test_an_ended_jobs_metrics_file_longer_than_a_look_is_read_whole_before_its_end_alerts(
    looks: tuple[Lifecycle, Alerts],
) -> None:
    """The metrics.jsonl tfrun.jobs writes is read LOOK_READ_BYTES a look too, and an ended job's end alerts wait
    until all of it is read: its last loss, a NaN 1 MB in, is a spike. Before, an ended job's file was read once,
    8 MB at most, and its end came after that whatever was left."""
    lifecycle, watch = looks
    row = _running(lifecycle, "fit")
    records = [json.dumps({"step": i, "loss": 1 / (i + 1)}) for i in range(1, 30_000)]
    Path(row.job_dir, "metrics.jsonl").write_text("\n".join([*records, '{"step": 30000, "loss": NaN}']) + "\n")
    assert len(records[0]) * len(records) > 2 * LOOK_READ_BYTES
    Path(row.job_dir, "output.log").write_text("training\n")
    ended, _ = lifecycle.end(row, JobState.SUCCEEDED, exit_code=0, finished_at=2.0)
    made = 1
    while not watch._look(ended, whole=True):
        made += 1
        assert made < 100
    assert made > 2
    assert [alert.rule for alert in watch.store.alerts(row.id, 10)] == ["spike", "done"]
