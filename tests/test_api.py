"""The Python API (`tfrun.Client`, client/library/api.py) used for real: submit, wait, logs, metrics, cancel, locally
and over SSH, and its errors, typed and worded as the CLI words them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Tfrun, gated_job, local_and_ssh, write_script

import tfrun
from tfrun.client.library.api import AsyncClient, NoSuchJob
from tfrun.protocol.admin import Shutdown
from tfrun.protocol.channel import RemoteError
from tfrun.protocol.watching import Top
from tfrun.protocol.wire import _REGISTRY, ProtocolError, Request

LOSSES = "for step in range(1, 4):\n    print(f'step {step} loss={1.0 / step:.3f}', flush=True)\n"


@pytest.fixture
def client(tf: Tfrun, monkeypatch: pytest.MonkeyPatch) -> Iterator[tfrun.Client]:
    """A `tfrun.Client` of `tf`'s daemon, in this process, with `tf`'s environment: the local daemon, or
    host "box" through sshd."""
    for name, value in tf.env.items():
        monkeypatch.setenv(name, value)
    with tfrun.Client("box" if tf.remote else None) as c:
        yield c


@local_and_ssh
def test_submit_wait_logs_and_metrics(tf: Tfrun, client: tfrun.Client, project: Path) -> None:
    script = str(write_script(project, "train.py", LOSSES))
    job = client.submit(script, ["--lr", "0.1"], tfrun.JobOptions(name="lr-0.1"))
    final = job.wait()
    assert (final.state, final.exit_code, final.name, final.args) == ("succeeded", 0, "lr-0.1", ["--lr", "0.1"])
    assert list(job.logs()) == ["step 1 loss=1.000", "step 2 loss=0.500", "step 3 loss=0.333"]
    assert [(s.step, s.values["loss"]) for s in job.metrics()] == [(1, 1.0), (2, 0.5), (3, 0.333)]
    assert [j.id for j in client.jobs(all=True)] == [job.id] and client.jobs() == []
    assert client.status("lr-0.1").id == job.id
    assert tf.job(job.id)["state"] == "succeeded"  # the CLI sees what the API did


@local_and_ssh
def test_logs_follow_to_the_end_and_cancel(tf: Tfrun, client: tfrun.Client, project: Path, gate: Path) -> None:
    gated = client.submit(str(write_script(project, "gated.py", gated_job(2, 2, 7, gate))))
    lines = client.logs(str(gated.id), follow=True)
    assert next(lines).startswith("before 0")
    gate.touch()
    assert [line.split()[:2] for line in lines][-1] == ["after", "1"]  # followed until the job ended
    assert gated.wait().exit_code == 7
    sleeper = client.submit(str(write_script(project, "sleep.py", "import time\ntime.sleep(600)\n")))
    result = sleeper.cancel(grace=1)
    assert result.ok and sleeper.wait().state == "cancelled"


@local_and_ssh
def test_no_such_job_is_typed_and_worded_as_the_cli_says_it(tf: Tfrun, client: tfrun.Client) -> None:
    cli = tf.run("status", "9999").stderr.strip()
    for call in (lambda: client.status("9999"), lambda: client.wait("9999"), lambda: list(client.logs("9999"))):
        with pytest.raises(NoSuchJob) as caught:
            call()
        assert isinstance(caught.value, RemoteError) and cli == f"tfrun: error: {caught.value}"
    assert [r.ok for r in client.cancel(["9999"])] == [False]  # a result, as `tfrun cancel` shows it


def test_a_bad_submit_is_a_one_line_error(client: tfrun.Client, project: Path) -> None:
    with pytest.raises(tfrun.TfrunError, match=r"missing\.py: no such file"):
        client.submit(str(project / "missing.py"))


def test_a_reply_of_the_wrong_type_is_a_protocol_error(tf: Tfrun, client: tfrun.Client) -> None:
    """`Channel.ask` checks every reply against what its request names: a `Top` answered by a `JobList`
    is refused, not handed on (nor checked by an assert, which `python -O` drops)."""

    async def mislabelled() -> None:
        channel = await AsyncClient().connect()
        try:
            top = Top()
            vars(top)["TYPE"] = "list"  # the daemon answers a ListJobs
            await channel.ask(top)
        finally:
            channel.close()

    with pytest.raises(ProtocolError, match="expected 'top_reply' in reply to 'list', got 'jobs'"):
        asyncio.run(mislabelled())


def test_every_request_names_the_replies_the_daemon_sends() -> None:
    """What each request declares it is answered with is what the fuzz test sees the daemon answer."""
    from test_fuzz import ANSWERS

    requests = [cls for cls in _REGISTRY.values() if issubclass(cls, Request) and cls is not Shutdown]
    assert {cls.TYPE: sorted(reply.TYPE for reply in cls.REPLIES) for cls in requests} == {
        tag: sorted(replies) for tag, replies in ANSWERS.items()
    }
