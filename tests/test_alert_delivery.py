"""Alerts delivered: through a mail server down and a daemon restart, once, never twice after a kill, expired with
its reason when delivery keeps failing; Slack URLs and their secrets; `tfrun notify test`; bad options and config
refused in one line; the TLS context mail reuses, and only with the apprise it was checked against. Real aiosmtpd
and HTTP receivers on 127.0.0.1.
"""

from __future__ import annotations

import json
import sqlite3
import ssl
import time
from pathlib import Path

import pytest
from harness import Mailbox, Receiver, Tfrun, local_and_ssh, wait_for, write_script
from harness.alerting import PYTORCH_OOM, alerts_of, configure, printing, settled

pytestmark = [pytest.mark.slow]


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


@local_and_ssh
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
        (["--alert", "gpu-memory=80%"], "--alert gpu-memory=80%: gpu-memory is the box's rule, not a job's"),
        (["--no-alert", "disk-full"], "--no-alert disk-full: disk-full is the box's rule, not a job's"),
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
    (tf.home / "config.toml").chmod(0o600)  # as tfrun writes it: a 0644 one would be closed first, said in a line
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


def test_the_one_tls_context_mail_reuses_has_its_checks_on_at_every_mail() -> None:
    """apprise's SMTP plugin makes a TLS context per mail (30 ms of certificates); tfrun hands it one, made
    once. The plugin turns the checks off on it for a URL that says verify=no: the next mail's must have
    them on again. (The same through a real STARTTLS server: tests/test_alert_messages.py.)"""
    from apprise.plugins.email import smtp

    from tfrun.runner.alerts import outbox

    assert outbox._reuse_tls_context(), (
        "apprise's SMTP plugin is not one tfrun was checked against: read apprise/plugins/email/smtp.py, see that "
        "ReusedContext (runner/alerts/outbox.py) still fits it, and add its SHA-256 to REVIEWED_SMTP_PLUGINS"
    )
    plugin_ssl = vars(smtp)["ssl"]  # the module's own name for ssl, which outbox replaced
    assert isinstance(plugin_ssl, outbox.ReusedContext)
    first = plugin_ssl.create_default_context()
    first.check_hostname = False  # what the plugin does for ?verify=no
    first.verify_mode = ssl.CERT_NONE
    again = plugin_ssl.create_default_context()
    assert again is first
    assert again.verify_mode == ssl.CERT_REQUIRED and again.check_hostname
    assert plugin_ssl.CERT_NONE == ssl.CERT_NONE  # the rest of the module is the module's


def test_the_context_goes_only_into_the_smtp_plugin_it_was_checked_against() -> None:
    """The plugin's file as apprise ships it is one ReusedContext was checked against; the same file with one
    call changed (a newer apprise that configured its context per URL) is not, and would keep its own."""
    from apprise.plugins.email import smtp

    from tfrun.runner.alerts import outbox

    source = Path(smtp.__file__).read_bytes()
    assert outbox.reviewed(source)
    changed = source.replace(b"ssl.create_default_context()", b"ssl.create_default_context(cafile=self.cafile)")
    assert changed != source and not outbox.reviewed(changed)
