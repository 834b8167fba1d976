"""A real browser and a real `tfrun ui` for the tests of the web page (tests/test_ui.py): Debian's Chromium,
headless, driven by its chromedriver through Selenium; and the UI server as a user starts it, its URL read
from its first line."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import tempfile
import time
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


# One script finds the elements and reads them in the same moment: the pages redraw their parts as news comes (the
# job page its record every 5 s, the jobs page its rows), so an element found by one call and read by the next can
# be gone by then, and a wait on it fails at once with a stale reference instead of waiting.
# An attribute is read as Selenium's get_attribute reads it: the property where it is a string (an input's value
# as typed, a link's href in full), else the attribute as written.
READ_ELEMENTS = """const [css, name] = arguments;
return [...document.querySelectorAll(css)].map((found) => name === null
    ? found.innerText.replace(/[ \\t]+/g, " ").trim()
    : typeof found[name] === "string" ? found[name] : found.getAttribute(name));"""


def texts_of(driver: Any, css: str) -> list[str]:
    """The text of each element `css` selects, as shown (runs of blanks as one)."""
    return [str(text) for text in driver.execute_script(READ_ELEMENTS, css, None)]


def text_of(driver: Any, css: str) -> Optional[str]:
    """The text of the first element `css` selects; None where there is none."""
    return next(iter(texts_of(driver, css)), None)


def attributes_of(driver: Any, css: str, name: str) -> list[Optional[str]]:
    """One attribute of each element `css` selects (None where an element has none)."""
    return [None if value is None else str(value) for value in driver.execute_script(READ_ELEMENTS, css, name)]


def attribute_of(driver: Any, css: str, name: str) -> Optional[str]:
    """One attribute of the first element `css` selects; None where there is none or it lacks the attribute."""
    return next(iter(attributes_of(driver, css, name)), None)


def click(driver: Any, css: str, what: str, timeout: float = 30) -> None:
    """A real click on the first element `css` selects, once there is one: found again if the page redrew it
    between the find and the click."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            found = by_css(driver, css)
            if found:
                found[0].click()
                return
        except StaleElementReferenceException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


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
