"""`tfrun ui` (issue 46): every box's jobs, a job's live log and loss chart, cancel, in a real browser; and who
may use it: the key, the Host, the Origin, another user of this machine.

Two boxes: this machine's daemon and one reached through the tests' sshd (another TFRUN_HOME), shown by one
`tfrun ui`, read by one headless Chromium (Debian's, through its chromedriver and Selenium) for the module.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import Sshd, Tfrun, free_port, remote_client, wait_for, write_script
from harness.browser import UiServer, attribute_of, by_css, click, signed_in, start_ui, text_of
from harness.otheruser import OtherUser, mallory  # noqa: F401
from harness.relay import Relay
from selenium.webdriver.support.expected_conditions import alert_is_present
from selenium.webdriver.support.wait import WebDriverWait

from tfrun.protocol.wire import PROTOCOL_VERSION, Hello, encode

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

pytestmark = [pytest.mark.ssh, pytest.mark.browser, pytest.mark.slow]

# Prints a loss every 0.2 s, and a line of the test's (the gate file's text) as soon as the file appears.
_PRINTER = """
import os, sys, time
gate = sys.argv[1]
for step in range(3000):
    print(f"step {step} loss={1.0 / (step + 1):.6f}", flush=True)
    if os.path.exists(gate):
        print(open(gate).read(), flush=True)
        os.remove(gate)
    time.sleep(0.2)
"""


@dataclass
class Boxes:
    """This machine's daemon (`local`, whose client shows both boxes) and the box's, through sshd (`box`)."""

    local: Tfrun
    box: Tfrun
    folder: Path
    relay: Relay
    local_job: int
    box_job: int

    def gate(self, which: str, text: str) -> None:
        """Have the job of `which` box print `text`."""
        (self.folder / "gate.tmp").write_text(text)
        (self.folder / "gate.tmp").rename(self.folder / f"gate-{which}")


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory, sshd: Sshd) -> Iterator[Boxes]:
    folder = tmp_path_factory.mktemp("ui")
    client = folder / "client-home"
    box = remote_client(Tfrun(folder / "box-home", client_home=client), sshd)
    relay = Relay(sshd.port)  # the link to the box, which a test freezes
    for written in (client / ".config" / "tfrun" / "config.toml", client / ".ssh" / "known_hosts"):
        written.write_text(written.read_text().replace(f"127.0.0.1]:{sshd.port}", f"127.0.0.1]:{relay.port}")
                           .replace(f"127.0.0.1:{sshd.port}", f"127.0.0.1:{relay.port}"))  # fmt: skip
    local = Tfrun(folder / "local-home", client_home=client)  # the same client config: host "box" in it
    project = folder / "project"
    project.mkdir()
    write_script(project, "printer.py", _PRINTER)
    found = Boxes(local, box, folder, relay, 0, 0)
    try:
        found.local_job = local.submit("--name", "here", str(project / "printer.py"), str(folder / "gate-local"))
        found.box_job = box.submit("--name", "there", str(project / "printer.py"), str(folder / "gate-box"))
        yield found
    finally:
        box.cleanup()
        local.cleanup()
        relay.close()


@pytest.fixture(scope="module")
def ui(boxes: Boxes) -> Iterator[UiServer]:
    server = start_ui(boxes.local.env, boxes.folder)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(ui: UiServer) -> Iterator[WebDriver]:
    with signed_in(ui) as driver:
        yield driver


def test_the_jobs_page_lists_the_jobs_of_both_boxes(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    started = time.monotonic()
    browser.get(ui.base + "/")
    local_row = f'tr[data-box="local"][data-id="{boxes.local_job}"]'
    box_row = f'tr[data-box="box"][data-id="{boxes.box_job}"]'
    wait_for(lambda: by_css(browser, local_row) and by_css(browser, box_row), timeout=30, what="both boxes' rows")
    print(f"jobs page: both boxes' rows in {time.monotonic() - started:.2f} s")
    assert browser.current_url == ui.base + "/"  # the key is not in the address bar
    row = text_of(browser, box_row) or ""
    assert "there" in row and "running" in row, row
    assert wait_for(lambda: _loss_shown(browser, box_row), what="a last loss in the row")
    status = text_of(browser, "#boxes") or ""
    assert "local: up" in status and "box: up" in status, status
    by_css(browser, "#state")[0].send_keys("succeeded")  # a filter: no running row
    wait_for(lambda: not by_css(browser, box_row), what="the filter to hide the running job")
    assert "state=succeeded" in browser.current_url


def _loss_shown(browser: WebDriver, row: str) -> bool:
    return text_of(browser, f"{row} td.loss") not in (None, "", "-")


def test_a_line_the_job_prints_appears_in_its_page(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    browser.get(f"{ui.base}/job/box/{boxes.box_job}")
    wait_for(lambda: "loss=" in _log(browser), timeout=30, what="the log")
    wait_for(
        lambda: (text_of(browser, "#title") or "").startswith(f"job {boxes.box_job} there running"), what="its record"
    )  # its own feed
    mark = f"mark-{uuid.uuid4().hex}"
    printed = time.monotonic()
    boxes.gate("box", mark)
    wait_for(lambda: mark in _log(browser), timeout=20, what="the line in the page")
    print(f"a printed line in the page {time.monotonic() - printed:.2f} s after the job was asked to print it")


def _log(browser: WebDriver) -> str:
    return str(browser.execute_script("return document.getElementById('log').textContent"))


def test_the_chart_grows_as_the_job_prints_losses(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    browser.get(f"{ui.base}/job/local/{boxes.local_job}")
    first = wait_for(lambda: _points(browser), timeout=30, what="the chart's first points")
    wait_for(lambda: _points(browser) >= first + 5, timeout=20, what="the chart to grow")
    assert by_css(browser, "#chart canvas"), "uPlot drew the chart"
    console = browser.get_log("browser")  # type: ignore[no-untyped-call]  # selenium leaves it untyped
    errors = [entry["message"] for entry in console if entry["level"] == "SEVERE"]
    assert not errors, errors


def _points(browser: WebDriver) -> int:
    return int(browser.execute_script("return document.getElementById('chart').dataset.points"))


def test_the_log_filter_runs_on_the_box(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    """The page's URL carries `tfrun logs`' filters; the box sends only the lines that pass."""
    browser.get(f"{ui.base}/job/box/{boxes.box_job}?grep=%5Estep+1%5B0-9%5D+loss")
    wait_for(lambda: "step 19 " in _log(browser), timeout=30, what="the filtered log")
    steps = [int(line.split()[1]) for line in _log(browser).splitlines()]
    assert steps == list(range(10, 20)), steps
    field = attribute_of(browser, "#grep", "value")
    assert field == "^step 1[0-9] loss", field


def test_cancel_from_the_page_cancels_the_job(browser: WebDriver, ui: UiServer, boxes: Boxes, tmp_path: Path) -> None:
    write_script(tmp_path, "sleeper.py", "import time\nprint('loss 1.0', flush=True)\ntime.sleep(600)\n")
    job = boxes.local.submit(str(tmp_path / "sleeper.py"))
    browser.get(f"{ui.base}/job/local/{job}")
    wait_for(lambda: text_of(browser, "#state") == "running", timeout=30, what="the job running in its page")
    click(browser, "#cancel", "the cancel button")
    WebDriverWait(browser, 10).until(alert_is_present()).accept()  # "Cancel job N on local?", in its time
    wait_for(lambda: boxes.local.job(job)["state"] == "cancelled", timeout=30, what="the job cancelled")
    wait_for(lambda: text_of(browser, "#state") == "cancelled", timeout=10, what="the page to say so")


# -- who may use it ----------------------------------------------------------------------------------------------


def test_no_key_a_wrong_key_a_wrong_host_or_another_origin_is_refused(ui: UiServer, boxes: Boxes) -> None:
    assert ui.request("GET", "/", cookie=False).status == 403
    wrong = ui.request("GET", "/?key=" + "x" * len(ui.key), cookie=False)
    assert wrong.status == 403 and wrong.headers.get("Set-Cookie") is None
    given = ui.request("GET", "/job/local/1?key=" + ui.key + "&grep=a", cookie=False)
    assert given.status == 303 and given.headers.get("Location") == "/job/local/1?grep=a"
    cookie = given.headers.get("Set-Cookie") or ""
    assert f"tfrun-ui-{ui.port}={ui.key}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    assert ui.request("GET", "/").status == 200
    for host in ("evil.example", f"evil.example:{ui.port}", f"127.0.0.1:{ui.port + 1}", "127.0.0.1"):
        assert ui.request("GET", "/api/view", {"Host": host}).status == 403, host
    cancel = f"/api/job/local/{boxes.local_job}/cancel"
    for origin in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {}):
        refused = ui.request("POST", cancel, origin)
        assert refused.status == 403 and b"action" in refused.body, origin
    assert boxes.local.job(boxes.local_job)["state"] == "running"
    seen = ui.request("GET", "/api/view", {"Origin": "http://evil.example"})
    assert seen.status == 200 and not [name for name in seen.headers if name.lower().startswith("access-control")]
    bad = ui.request("POST", "/api/job/local/999999/cancel", {"Origin": ui.base})
    assert bad.status == 200 and b'"ok": false' in bad.body  # allowed; no such job


def test_the_key_is_on_no_command_line(ui: UiServer, browser: WebDriver, boxes: Boxes, tmp_path: Path) -> None:
    """Not the server's, nor the browser's that --open starts: it reads a 0600 page that redirects."""
    seen = tmp_path / "browser-saw"
    write_script(tmp_path, "browser", f"#!{sys.executable}\nimport os, sys\npage = sys.argv[1].removeprefix('file://')\n"
                 f"open({str(seen)!r}, 'w').write(repr((sys.argv, oct(os.stat(page).st_mode & 0o777), "
                 "open(page).read())))\n", executable=True)  # fmt: skip
    opened = start_ui({**boxes.local.env, "BROWSER": str(tmp_path / "browser")}, boxes.folder, "--open")
    try:
        argv, mode, page = eval(wait_for(lambda: seen.exists() and seen.read_text(), what="--open's browser"))
        keys = [ui.key, opened.key]
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert not [key for key in keys if key in cmdline], f"pid {pid}: {cmdline}"
    finally:
        opened.stop()
    assert not [arg for arg in argv if opened.key in arg], argv
    assert mode == "0o600" and opened.url in page, (mode, page)


def test_read_only_offers_no_action(boxes: Boxes) -> None:
    viewer = start_ui(boxes.local.env, boxes.folder, "--read-only", "--host", "local")
    try:
        assert b'"read_only": true' in viewer.request("GET", "/api/view").body
        assert viewer.request("POST", f"/api/job/local/{boxes.local_job}/cancel", {"Origin": viewer.base}).status in (
            404, 405)  # fmt: skip
        assert boxes.local.job(boxes.local_job)["state"] == "running"
    finally:
        viewer.stop()


def test_its_help_says_every_box_is_shown_without_host(boxes: Boxes) -> None:
    """`--host`'s help is shared by the verbs; ui's default is every box, not the default host's."""
    shown = " ".join(boxes.local.ok("ui", "--help").split())
    assert "Default: this machine's daemon and every configured host." in shown, shown
    assert "Default: the configured default host" in " ".join(boxes.local.ok("ps", "--help").split())


@pytest.mark.root
def test_another_user_is_refused_at_the_port(ui: UiServer, mallory: OtherUser) -> None:  # noqa: F811
    """mallory has the URL, key and all (a shoulder surfed): her connection is closed unheard, and told once."""
    code = "import sys, urllib.request\ntry:\n    print(urllib.request.urlopen(sys.argv[1], timeout=20).status)\n" \
           "except Exception as exc:\n    print('failed', type(exc).__name__)\n"  # fmt: skip
    for _ in range(2):
        got = mallory.python(code, ui.url)
        assert got.stdout.startswith("failed"), got.stdout + got.stderr
    assert ui.request("GET", "/api/view").status == 200  # the user's own still work
    told = [line for line in ui.stderr.read_text().splitlines() if "refused a connection" in line]
    assert told == [f"tfrun: refused a connection to 127.0.0.1:{ui.port} from uid {mallory.uid}, not you: only you "
                    "may use this page"], told  # fmt: skip


def test_a_box_that_cannot_be_reached_is_a_row_saying_why(browser: WebDriver, boxes: Boxes) -> None:
    """A configured host whose sshd is gone: its row says so in ssh's words; the other box's rows still come."""
    config = boxes.folder / "client-home" / ".config" / "tfrun" / "config.toml"
    kept = config.read_text()
    config.write_text(kept + f'\n[hosts.gone]\ndestination = "nobody@127.0.0.1:{free_port()}"\n')
    try:
        viewer = start_ui(boxes.local.env, boxes.folder, "--host", "all")
    finally:
        config.write_text(kept)
    try:
        browser.get(viewer.url)
        down = wait_for(lambda: text_of(browser, 'tr.down[data-box="gone"]'), timeout=30, what="the down box's row")
        assert "down:" in down and "refused" in down.lower(), down
        wait_for(lambda: by_css(browser, f'tr[data-box="box"][data-id="{boxes.box_job}"]'), what="the other box's row")
        assert not by_css(browser, 'tr[data-box="local"]'), "--host all: the configured hosts, not this machine"
        status = text_of(browser, "#boxes") or ""
        assert "gone: down" in status and "box: up" in status, status
    finally:
        viewer.stop()


def test_a_daemon_of_an_older_tfrun_is_a_row_naming_its_version_and_the_way_out(
    browser: WebDriver, boxes: Boxes, tmp_path: Path
) -> None:
    """What answers on a box's socket speaks an older protocol: its row says which tfrund it is and how to
    upgrade, in the words the CLI prints, and the page asks it nothing more than a hello."""
    old = Tfrun(tmp_path / "old-home", client_home=boxes.folder / "client-home")
    (old.home / "run").mkdir(parents=True, mode=0o700)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(old.home / "run" / "tfrund.sock"))
    listener.listen()
    heard: list[bytes] = []

    def answer() -> None:  # each connection: its first frame heard, an older daemon's hello answered
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                heard.append(conn.makefile("rb").readline())
                conn.sendall(encode(Hello(protocol=PROTOCOL_VERSION - 1, version="0.0.9", role="daemon")))

    threading.Thread(target=answer, daemon=True).start()
    viewer = start_ui(old.env, tmp_path, "--host", "local")
    try:
        browser.get(viewer.url)
        down = wait_for(lambda: text_of(browser, 'tr.down[data-box="local"]'), timeout=30, what="the old daemon's row")
        assert f"tfrund 0.0.9 speaks protocol {PROTOCOL_VERSION - 1}" in down, down
        assert "pip install -U tfrun" in down and "tfrund stop" in down, down
        assert heard and all(b'"type":"hello"' in frame for frame in heard), heard
    finally:
        viewer.stop()
        listener.close()


def test_the_page_resumes_by_itself_after_the_link_froze(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    """The box's link stops passing bytes (a laptop asleep, a NAT that forgot): the log carries on by itself
    once the connection is made again (the keeper's next one), from the byte it had reached."""
    browser.get(f"{ui.base}/job/box/{boxes.box_job}")
    wait_for(lambda: "loss=" in _log(browser), timeout=30, what="the log")
    frozen = time.monotonic()
    assert boxes.relay.freeze_held() >= 1
    mark = f"after-the-freeze-{uuid.uuid4().hex}"
    boxes.gate("box", mark)
    wait_for(lambda: mark in _log(browser), timeout=60, what="the log to resume")
    print(f"the page's log resumed {time.monotonic() - frozen:.1f} s after the link froze")
    steps = [int(line.split()[1]) for line in _log(browser).splitlines() if line.startswith("step ")]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "a line lost or repeated"
