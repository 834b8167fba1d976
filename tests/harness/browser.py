"""A real browser and a real `tfrun ui` for the tests of the web page (tests/test_ui.py): Debian's Chromium,
headless, driven by its chromedriver through Selenium; and the UI server as a user starts it, its URL read
from its first line."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import pytest

from .home import TFRUN

# What lets Chromium run here: as root (no sandbox), without a GPU, and without reaching out (updates, sync).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,1000")  # fmt: skip


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, driven through Selenium; skipped where either is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install .[test])")
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("no chromium or chromedriver (.ci/run installs Debian's chromium and chromium-driver)")
    with tempfile.TemporaryDirectory(prefix="tfrun-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the pages' console: a script's errors
        browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
        try:
            yield browser
        finally:
            browser.quit()


def by_css(driver: Any, css: str) -> list[Any]:
    """The elements `css` selects on the page as it is now."""
    return list(driver.find_elements("css selector", css))


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


@dataclass
class UiServer:
    """A running `tfrun ui`: its process, the URL it printed (with its key), what it wrote on stderr."""

    proc: subprocess.Popen[str]
    url: str
    stderr: Path

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def key(self) -> str:
        return urlsplit(self.url).query.removeprefix("key=")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, headers: Optional[dict[str, str]] = None, cookie: bool = True) -> Reply:
        """`method path` with exactly these headers (a Host of our choosing too), and the key's cookie unless
        `cookie` is False."""
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if cookie:
            sent["Cookie"] = f"tfrun-ui-{self.port}={self.key}"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in sent.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        reply = Reply(response.status, response.headers, response.read())
        connection.close()
        return reply

    def stop(self) -> str:
        """Stop it as Ctrl-C does; what it wrote on stderr."""
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.stderr.read_text()


def start_ui(env: dict[str, str], folder: Path, *args: str) -> UiServer:
    """`tfrun ui ARGS` with `env`, once it printed its URL."""
    stderr = folder / f"ui-{len(list(folder.glob('ui-*')))}.err"
    proc = subprocess.Popen([*TFRUN, "ui", *args], env=env, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), stderr.read_text()
    return UiServer(proc, url, stderr)


@contextlib.contextmanager
def signed_in(ui: UiServer) -> Iterator[Any]:
    """A browser given the UI's key once, which it exchanged for the cookie every later request needs."""
    with chromium() as driver:
        driver.get(ui.url)
        yield driver
