#!/usr/bin/env python3
"""The terminal pictures in the docs (docs/img/term-*.png), taken again: `tfrun top`, `tfrun metrics --plot` and
`tfrun ps -a` as a terminal shows them. Run by hand from the checkout after a change to what they print (about a
minute; needs tmux, and Debian's chromium and chromium-driver, as the tests of the pages do):

    .venv/bin/python -m bench.termshots [--out docs/img]
    .venv/bin/python -m bench.termshots --site [--site-out /tmp/site-shots-png]

It lives beside bench/screenshots.py (the pictures of `tfrun ui`) and shares its setup: the tests' real parts
(tests/harness/), its training script that prints a loss as a training loop does, and its way of saving a page;
its stand-in for two GPUs (TFRUN_GPU_STANDIN) is its own, both GPUs busy. This machine's daemon runs a few real
jobs of that script: two done and one failed, one holding GPU 0, an array of three (one on GPU 1, two queued for
a GPU), one queued for both. Each command runs in a shell in a tmux pane of its own, typed as a user types it; the
pane is read with its colours (`tmux capture-pane -e`), written as HTML (monospace, dark background: the SGR codes
as spans) and saved by the tests' headless Chromium as a PNG of 256 colours, some 10-60 KB each.

--site takes pictures of the docs site instead, for a review: it builds the site with mkdocs into /tmp/site-shots,
serves it on 127.0.0.1 and saves its Home page, Getting started and one how-to (the box), each as the first screen
at 1280x800 and as the whole page at 1280 wide, into --site-out (not the repository), printing each page's HTML
size and each PNG's.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.screenshots import GB, TRAIN, moving, shoot
from tests.harness import Tfrun, wait_for, write_script
from tests.harness.browser import chromium

CHECKOUT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # tfrun and tfrund of this checkout's environment

# The pictures: the command typed, the pane's size (columns, rows), how long the command runs before the pane is
# read (top redraws every second: a few frames in, its trends have moved), and whether it stays on screen (top).
SHOTS = {
    "top": ("tfrun top", (116, 24), 4.0, True),
    "metrics-plot": ("tfrun metrics --plot baseline", (104, 24), 2.5, False),
    "ps": ("tfrun ps -a", (112, 14), 2.5, False),
}

# The terminal's colours: a dark theme's 16 (black, red, green, yellow, blue, magenta, cyan, white; then bright).
FOREGROUND, BACKGROUND = "#d4d4d4", "#1b1d23"
PALETTE = ("#1b1d23", "#e06c75", "#98c379", "#e5c07b", "#61afef", "#c678dd", "#56b6c2", "#d4d4d4",
           "#5c6370", "#ef8a92", "#b5e890", "#f0d197", "#82c4ff", "#d899ec", "#79d3de", "#ffffff")  # fmt: skip
SGR = re.compile(r"\x1b\[([0-9;:]*)m")
# Braille (the dots of --plot's curves): no monospace font here has it, and the proportional one's are wider
# than a cell; each is set in a box of one cell, as a terminal does.
NOT_MONOSPACE = re.compile("([\u2800-\u28ff])")
OTHER_ESCAPES = re.compile(r"\x1b(\[[0-9;:?]*[A-Za-z]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>])")


def color_256(n: int) -> str:
    """xterm's colour `n` of 256: the 16 above, a 6x6x6 cube, then 24 greys."""
    if n < 16:
        return PALETTE[n]
    if n < 232:
        levels = [0, 95, 135, 175, 215, 255]
        r, g, b = levels[(n - 16) // 36], levels[(n - 16) // 6 % 6], levels[(n - 16) % 6]
        return f"#{r:02x}{g:02x}{b:02x}"
    grey = 8 + (n - 232) * 10
    return f"#{grey:02x}{grey:02x}{grey:02x}"


def apply_sgr(style: dict[str, Any], params: str) -> None:
    """Change `style` (fg, bg, bold, dim, italic, underline, reverse) as the SGR parameters `params` say."""
    codes = [int(p) if p.isdigit() else 0 for p in re.split(r"[;:]", params)] if params else [0]
    i = 0
    while i < len(codes):
        code = codes[i]
        if code == 0:
            style.clear()
        elif code in (1, 2, 3, 4, 7):
            style[{1: "bold", 2: "dim", 3: "italic", 4: "underline", 7: "reverse"}[code]] = True
        elif code == 22:
            style.pop("bold", None)
            style.pop("dim", None)
        elif code in (23, 24, 27):
            style.pop({23: "italic", 24: "underline", 27: "reverse"}[code], None)
        elif 30 <= code <= 37 or 90 <= code <= 97:
            style["fg"] = PALETTE[code - 30 if code < 90 else code - 90 + 8]
        elif 40 <= code <= 47 or 100 <= code <= 107:
            style["bg"] = PALETTE[code - 40 if code < 100 else code - 100 + 8]
        elif code in (39, 49):
            style.pop("fg" if code == 39 else "bg", None)
        elif code in (38, 48) and i + 1 < len(codes):
            key = "fg" if code == 38 else "bg"
            if codes[i + 1] == 5 and i + 2 < len(codes):
                style[key] = color_256(codes[i + 2])
                i += 2
            elif codes[i + 1] == 2 and i + 4 < len(codes):
                style[key] = "#{:02x}{:02x}{:02x}".format(*codes[i + 2 : i + 5])
                i += 4
        i += 1


def css_of(style: dict[str, Any]) -> str:
    fg, bg = style.get("fg", FOREGROUND), style.get("bg")
    if style.get("reverse"):
        fg, bg = bg or BACKGROUND, fg
    rules = [f"color:{fg}"] if fg != FOREGROUND else []
    rules += [f"background:{bg}"] if bg else []
    rules += ["font-weight:bold"] if style.get("bold") else []
    rules += ["opacity:0.62"] if style.get("dim") else []
    rules += ["font-style:italic"] if style.get("italic") else []
    rules += ["text-decoration:underline"] if style.get("underline") else []
    return ";".join(rules)


def cells(text: str) -> str:
    """`text` as HTML, each character of another font's (NOT_MONOSPACE) in a box one cell wide."""
    return NOT_MONOSPACE.sub(r'<span class="cell">\1</span>', html.escape(text))


def ansi_to_html(text: str, title: str, columns: int) -> str:
    """A page that shows the terminal text `text` (with SGR colour codes) as a terminal window titled `title`,
    `columns` wide: each run of one style a span; trailing blank lines dropped."""
    lines = text.rstrip("\n").split("\n")
    while lines and not SGR.sub("", lines[-1]).strip():
        lines.pop()
    style: dict[str, Any] = {}
    out = []
    for line in lines:
        parts, at = [], 0
        line = OTHER_ESCAPES.sub(lambda m: m.group(0) if m.group(0).endswith("m") and m.group(0)[1] == "[" else "",
                                 line)  # fmt: skip
        for match in SGR.finditer(line):
            parts.append((dict(style), line[at : match.start()]))
            apply_sgr(style, match.group(1))
            at = match.end()
        parts.append((dict(style), line[at:]))
        spans = "".join(
            f'<span style="{css}">{cells(chunk)}</span>' if (css := css_of(s)) else cells(chunk)
            for s, chunk in parts
            if chunk
        )
        out.append(spans)
    body = "\n".join(out)
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
html, body {{ margin: 0; background: #ffffff; overflow: hidden; }}
.window {{ width: max-content; margin: 0; background: {BACKGROUND}; border-radius: 8px; overflow: hidden; }}
.cell {{ display: inline-block; width: 1ch; }}
.bar {{ height: 30px; background: #2c2f36; display: flex; align-items: center; padding: 0 12px;
        font: 13px 'DejaVu Sans', sans-serif; color: #9aa0aa; }}
.dot {{ width: 12px; height: 12px; border-radius: 50%; margin-right: 8px; }}
.title {{ flex: 1; text-align: center; margin-right: 60px; }}
pre {{ margin: 0; padding: 12px 16px 14px; color: {FOREGROUND}; font: 15px/1.3 'DejaVu Sans Mono', monospace;
       width: {columns}ch; white-space: pre; }}
</style></head><body><div class="window" id="window"><div class="bar">
<span class="dot" style="background:#ff5f57"></span><span class="dot" style="background:#febc2e"></span>
<span class="dot" style="background:#28c840"></span><span class="title">{html.escape(title)}</span></div>
<pre>{body}</pre></div></body></html>
"""


class Tmux:
    """A tmux server of our own (its socket in `work`), with a configuration of two lines: one window a picture, each a
    bash with a plain prompt in the project's folder and the environment of the tfrun it is given."""

    def __init__(self, work: Path) -> None:
        self.socket = work / "tmux.sock"
        self.config = work / "tmux.conf"  # no status line: the pane is the whole window
        self.config.write_text("set -g status off\nset -g default-terminal tmux-256color\n")
        self.rcfile = work / "bashrc"  # the prompt (bash takes no PS1 from its environment here)
        self.rcfile.write_text("PS1='$ '\n")

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.config), *args],
                                env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
        assert result.returncode == 0, f"tmux {' '.join(args)}: {result.stderr}"
        return result.stdout

    def shell(self, name: str, size: tuple[int, int], env: dict[str, str], cwd: Path) -> None:
        env = {**env, "PS1": "$ ", "TERM": "tmux-256color", "COLORTERM": "", "PATH": f"{BIN}:{env['PATH']}"}
        env.pop("NO_COLOR", None)
        env.pop("FORCE_COLOR", None)
        columns, rows = size
        self.tmux("new-session", "-d", "-s", name, "-x", str(columns), "-y", str(rows), "-c", str(cwd),
                  "-e", f"PS1={env['PS1']}", "-e", f"PATH={env['PATH']}", "-e", f"HOME={env['HOME']}",
                  "-e", f"TFRUN_HOME={env['TFRUN_HOME']}", "-e", f"XDG_CACHE_HOME={env['XDG_CACHE_HOME']}",
                  f"bash --rcfile {self.rcfile}", env=env)  # fmt: skip
        self.wait_prompt(name, what=f"{name}'s prompt")

    def wait_prompt(self, name: str, what: str) -> None:
        """Wait until the pane's last line is the shell's prompt again."""
        wait_for(lambda: self.capture(name).rstrip().endswith("$"), what=what)

    def type(self, name: str, line: str) -> None:
        self.tmux("send-keys", "-t", name, "-l", line)
        self.tmux("send-keys", "-t", name, "Enter")

    def capture(self, name: str) -> str:
        return self.tmux("capture-pane", "-e", "-p", "-t", name)

    def stop(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30)


def jobs(local: Tfrun, project: Path) -> None:
    """This machine's jobs, as the pictures show them: two done (`baseline` the longer, whose curve --plot draws)
    and one failed, then the long one on GPU 0, an array of three (a job takes one GPU unless --gpus says: one
    task runs on GPU 1, two wait), and one queued for both GPUs."""
    submit = functools.partial(local.run, cwd=project)

    def job(*args: str) -> list[int]:
        result = submit("submit", *args)
        assert result.returncode == 0, result.stderr
        return [int(x) for x in result.stdout.split()]

    ended = job("--name", "baseline", "--env", "LR=0.003", "train.py", "8", "0.01")
    ended += job("--name", "warmup-test", "--env", "LR=0.001", "train.py", "2", "0.01")
    ended += job("--name", "big-lr", "--env", "LR=0.05", "train.py", "6", "0.01", "fail")
    for ref in ended:
        local.run("wait", str(ref), timeout=300)
    running = job("--name", "resnet-long", "--gpus", "1", "--env", "LR=0.002", "train.py", "200", "0.05")
    wait_for(lambda: local.job(running[0])["state"] == "running", what="the long job running")
    job("--name", "sweep", "--array", "lr=0.002,0.004,0.008", "train.py", "100", "0.1")
    job("--name", "vit-large", "--gpus", "2", "--env", "LR=0.001", "train.py", "50", "0.05")
    time.sleep(15)  # the running jobs have a loss and a trend


def stand_in_gpus(path: Path, age: float) -> None:
    """Two H100s as NVML would report them `age` seconds into the run, each held by a training job (as
    bench/screenshots.py's, whose GPU 1 is idle): GPU 0's memory climbing to 61 GB in 20 s, GPU 1's to 23 GB in
    10 s, then steady; their load near 90 % and 70 %. Written whole, then renamed: a look never reads half of it."""
    figures = [(61, 20, 88), (23, 10, 70)]
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "total": 80 * GB, "uuid": f"GPU-{i}",
             "used": int((1 + (top - 1) * min(1.0, age / climb) + random.uniform(-0.3, 0.3)) * GB),
             "utilization": max(0, min(100, int(load + 6 * math.sin(age / 3 + i) + random.uniform(-3, 3))))}
            for i, (top, climb, load) in enumerate(figures)]  # fmt: skip
    path.with_suffix(".tmp").write_text(json.dumps(gpus))
    os.replace(path.with_suffix(".tmp"), path)


def viewport(browser: Any, width: int, height: int) -> None:
    """Chromium's viewport set to `width` x `height` CSS pixels, one device pixel each."""
    screen = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", screen)


def terminal_shots(out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="tfrun-termshots-"))
    local = Tfrun(work / "local-home", client_home=work / "client-home")
    local.env["TFRUN_GPU_STANDIN"] = str(work / "nvml.json")
    stand_in_gpus(work / "nvml.json", 0.0)  # there before the daemon starts: it counts its GPUs then
    stop = threading.Event()
    threading.Thread(target=moving, args=(work / "nvml.json", stop, stand_in_gpus), daemon=True).start()
    project = work / "project"
    project.mkdir()
    write_script(project, "train.py", TRAIN)
    tmux = Tmux(work)
    try:
        jobs(local, project)
        captured = {}
        for name, (command, size, pause, live) in SHOTS.items():
            tmux.shell(name, size, local.env, project)
            tmux.type(name, command)
            time.sleep(pause)
            if not live:
                tmux.wait_prompt(name, what=f"{command} done")
            captured[name] = (command, size, tmux.capture(name))
            if live:
                tmux.tmux("send-keys", "-t", name, "q")
        with chromium() as browser:
            for name, (command, (columns, _), text) in captured.items():
                page = work / f"{name}.html"
                page.write_text(ansi_to_html(text, command if name == "top" else "bash", columns))
                viewport(browser, 1600, 1200)
                browser.get(page.as_uri())
                width, height = browser.execute_script(
                    "const r = document.getElementById('window').getBoundingClientRect();"
                    "return [Math.ceil(r.width), Math.ceil(r.height)];"
                )
                viewport(browser, width, height)
                target = out / f"term-{name}.png"
                saved = shoot(browser, page.as_uri(), "document.fonts.status === 'loaded'", target)
                print(f"{target}: {width}x{height}, {saved / 1024:.0f} KB")
    finally:
        tmux.stop()
        stop.set()
        local.run("cancel", "--all", "--grace", "1")
        local.cleanup()
        shutil.rmtree(work, ignore_errors=True)


SITE_PAGES = {"home": "index.html", "getting-started": "getting-started/", "how-to-box": "how-to/box/"}


def site_shots(out: Path, built: Path) -> None:
    """The docs site built into `built`, served on 127.0.0.1, and three of its pages saved into `out`."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(built)], cwd=CHECKOUT,
                           env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    if build.returncode != 0:
        sys.exit(f"mkdocs build failed ({build.returncode}):\n{build.stderr[-3000:]}")
    out.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(QuietHandler, directory=str(built))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with chromium() as browser:
            for name, path in SITE_PAGES.items():
                source = built / (path + "index.html" if path.endswith("/") else path)
                if not source.exists():
                    print(f"{name}: {source} not built, left out")
                    continue
                viewport(browser, 1280, 800)
                ready = "document.readyState === 'complete' && document.fonts.status === 'loaded'"
                first = shoot(browser, base + path, ready, out / f"{name}.png")
                height = browser.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
                viewport(browser, 1280, max(800, height))
                whole = shoot(browser, base + path, ready, out / f"{name}-full.png")
                print(f"{name} ({path}): HTML {source.stat().st_size / 1024:.0f} KB; "
                      f"{out / f'{name}.png'} 1280x800 {first / 1024:.0f} KB; "
                      f"{out / f'{name}-full.png'} 1280x{max(800, height)} {whole / 1024:.0f} KB")  # fmt: skip
    finally:
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="the folder of the PNGs (docs/img)")
    parser.add_argument("--site", action="store_true", help="take the docs site's pages instead (for a review)")
    parser.add_argument("--site-out", type=Path, default=Path("/tmp/site-shots-png"),
                        help="the folder of the site's PNGs (/tmp/site-shots-png)")  # fmt: skip
    parser.add_argument("--site-dir", type=Path, default=Path("/tmp/site-shots"),
                        help="where mkdocs builds the site (/tmp/site-shots)")  # fmt: skip
    args = parser.parse_args()
    if args.site:
        site_shots(args.site_out, args.site_dir)
        return
    if shutil.which("tmux") is None:
        sys.exit("needs tmux (Debian: apt-get install -y tmux)")
    args.out.mkdir(parents=True, exist_ok=True)
    terminal_shots(args.out)


if __name__ == "__main__":
    main()
