"""How an alert reads: a failure's log tail kept line for line in a mail's text and HTML (drawn by a real headless
Chromium) and in a JSON post, Slack's mrkdwn with the output in a code block (a Slack stand-in over TLS), a mail
over STARTTLS sent only where the certificate holds or the URL says verify=no, and what `notify test` and `submit`
say of a broken URL.
"""

from __future__ import annotations

import datetime
import html
import json
import os
import re
import shutil
import socketserver
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from harness import Mailbox, Receiver, Tfrun, free_port, wait_for, write_script
from harness.alerting import configure, printing, settled

pytestmark = [pytest.mark.slow]


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


def test_mail_over_starttls_checks_the_certificate_unless_its_url_says_verify_no(tmp_path: Path) -> None:
    """tfrun hands apprise's SMTP plugin one TLS context for every mail (runner/alerts/outbox.py), whose checks
    a URL with verify=no turns off: the next URL's mail must check the certificate again. A real aiosmtpd that
    requires STARTTLS, with a certificate nobody signed, so only verify=no may reach it."""
    from aiosmtpd.controller import Controller

    from tfrun.runner.alerts import outbox

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed("localhost", tmp_path))
    received: list[bytes] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            received.append(envelope.content)
            return "250 OK"

    port = free_port()
    server = Controller(Handler(), hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True)
    server.start()
    try:
        url = f"mailtos://localhost:{port}?from=tfrund@example.com&to=ml-team@example.com&mode=starttls"
        refused = outbox.send(url, "checked", "first")
        sent = outbox.send(url + "&verify=no", "not checked", "second")
        refused_again = outbox.send(url, "checked again", "third")
    finally:
        server.stop()
    assert sent is None and len(received) == 1 and b"second" in received[0]
    assert refused and refused_again and "localhost" in refused_again


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
