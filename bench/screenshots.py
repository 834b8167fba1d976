#!/usr/bin/env python3
"""The screenshots of `tfrun ui` in the docs (docs/img/ui-*.png), taken again. Run by hand from the checkout
after a change to the pages (about a minute; needs openssh-server, root for the test sshd, and Debian's
chromium and chromium-driver, as the tests of the pages do):

    .venv/bin/python -m bench.screenshots [--out docs/img]

It lives with bench/ as they use the tests' real parts (tests/harness/): two boxes, this machine's daemon and one
reached through a loopback sshd, each running a few real jobs of a small script that prints its loss as a training
loop does (one still running, some done, one failed, an array of three to compare); one `tfrun ui` showing both.
This machine's daemon sees two GPUs through the tests' NVML stand-in (TFRUN_GPU_STANDIN; the machine that takes the
screenshots need not have one), whose figures a thread moves as a training job's would, and the running job holds
one of them: the GPUs page and that job's page show them; each page read by the tests' headless Chromium at a
1280x800 viewport, saved as a PNG of 256 colours (no dithering: the text stays sharp), some 10-40 KB a page. A page
this tfrun does not serve (404) is left out.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageChops

from tests.harness import Sshd, Tfrun, remote_client, wait_for, write_script
from tests.harness.browser import chromium, start_ui

# A training loop as a user writes one: a loss that falls with noise, a validation loss and accuracy each
# epoch, its learning rate (LR: --env, or the array's value); `fail` ends in an error as a diverging run does.
TRAIN = """
import math, os, random, sys, time
lr, epochs, pace, fail = float(os.environ["LR"]), int(sys.argv[1]), float(sys.argv[2]), "fail" in sys.argv
random.seed(int(lr * 1e5))
step = 0
for epoch in range(1, epochs + 1):
    for _ in range(50):
        step += 1
        loss = 2.3 * math.exp(-step * lr * 3) + 0.15 + random.gauss(0, 0.015)
        print(f"epoch {epoch} step {step} loss={loss:.4f} lr={lr:g}", flush=True)
        time.sleep(pace)
    print(f"epoch {epoch}: val_loss={loss * 1.1 + 0.05:.4f} val_accuracy={1 - loss / 2.6:.4f}", flush=True)
    if fail and epoch == 3:
        print("Traceback (most recent call last):\\n  File \\"train.py\\", line 12\\nFloatingPointError: loss is nan")
        sys.exit(1)
"""
PAGES = ("jobs", "job", "compare", "gpus", "alerts")
GB = 10**9


def stand_in_gpus(path: Path, age: float) -> None:
    """Two H100s as NVML would report them `age` seconds into the run (the daemon reads the file afresh at each
    look): GPU 0 as a training job holds it (its memory climbing to 61 GB in 20 s, then steady; its load near
    90 %), GPU 1 idle. Written whole, then renamed: a look never reads half of it."""
    used = int((2 + 59 * min(1.0, age / 20) + random.uniform(-0.4, 0.4)) * GB)
    load = max(0, min(100, int(88 + 6 * math.sin(age / 3) + random.uniform(-3, 3))))
    figures = [(used, load), (GB // 2, 0)]
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "used": memory, "total": 80 * GB, "utilization": busy,
             "uuid": f"GPU-{i}"} for i, (memory, busy) in enumerate(figures)]  # fmt: skip
    path.with_suffix(".tmp").write_text(json.dumps(gpus))
    os.replace(path.with_suffix(".tmp"), path)


def moving(path: Path, stop: threading.Event, figures: Callable[[Path, float], None] = stand_in_gpus) -> None:
    """The stand-in's `figures` (stand_in_gpus, or bench/termshots.py's) moved every half second until `stop`."""
    started = time.monotonic()
    while not stop.wait(0.5):
        figures(path, time.monotonic() - started)


def jobs(local: Tfrun, box: Tfrun, project: Path) -> dict[str, Any]:
    """The jobs of both boxes; the ids the pages are shown with."""
    train = str(project / "train.py")
    running = local.submit("--name", "resnet-long", "--gpus", "1", "--env", "LR=0.002", train, "200", "0.05")
    done = [
        local.submit("--name", f"baseline-{lr}", "--env", f"LR={lr}", train, "4", "0.01") for lr in ("0.001", "0.003")
    ]
    failed = box.submit("--name", "big-lr", "--env", "LR=0.05", train, "6", "0.01", "fail")
    sweep = box.ok("submit", "--name", "sweep", "--array", "lr=0.002,0.004,0.008", train, "6", "0.02")
    tasks = [int(x) for x in sweep.split()]
    for tf, job in [(local, j) for j in done] + [(box, failed)] + [(box, t) for t in tasks]:
        tf.run("wait", str(job), timeout=300)
    wait_for(lambda: local.job(running)["state"] == "running", what="the long job running")
    time.sleep(12)  # its chart has some 150 points, its GPU chart a few samples more
    return {"running": running, "tasks": tasks, "done": done}


def shoot(browser: Any, url: str, ready: str, out: Path) -> int:
    """Open `url`, wait until the script `ready` is true, save the viewport as a 256-colour PNG; its size."""
    browser.get(url)
    wait_for(lambda: browser.execute_script(f"return Boolean({ready})"), timeout=60, what=f"{out.name} drawn")
    time.sleep(1.5)  # the live updates of a second and the charts' last draw
    shot = trimmed(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB"))
    shot.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, optimize=True)
    return out.stat().st_size


def trimmed(shot: Any, margin: int = 16) -> Any:
    """The screenshot less the empty rows under the page's content (a jobs page of a few rows is otherwise mostly
    background in a doc), keeping `margin` pixels of it: the background is the bottom-left pixel's colour."""
    background = Image.new(shot.mode, shot.size, shot.getpixel((0, shot.height - 1)))
    box = ImageChops.difference(shot, background).getbbox()
    return shot if box is None else shot.crop((0, 0, shot.width, min(shot.height, box[3] + margin)))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="the folder of the PNGs (docs/img)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tfrun-screenshots-"))
    sshd = Sshd(work / "sshd")
    client = work / "client-home"
    box = remote_client(Tfrun(work / "box-home", client_home=client), sshd)
    local = Tfrun(work / "local-home", client_home=client)
    local.env["TFRUN_GPU_STANDIN"] = str(work / "nvml.json")
    stand_in_gpus(work / "nvml.json", 0.0)  # there before the daemon starts: it counts its GPUs then
    stop = threading.Event()
    threading.Thread(target=moving, args=(work / "nvml.json", stop), daemon=True).start()
    project = work / "project"
    project.mkdir()
    write_script(project, "train.py", TRAIN)
    try:
        shown = jobs(local, box, project)
        ui = start_ui(local.env, work)
        base = ui.url.split("?")[0].rstrip("/")
        refs = ",".join(f"box:{task}" for task in shown["tasks"])
        urls = {
            "jobs": (f"{base}/", "document.querySelectorAll('#jobs tbody tr[data-id]').length >= 7"),
            "job": (f"{base}/job/local/{shown['running']}", "document.getElementById('gpu-memory').dataset.points > 2"),
            "compare": (f"{base}/compare?jobs={refs}", "document.querySelector('canvas')"),
            "gpus": (
                f"{base}/gpus",
                "document.querySelector('[data-chart=\"memory\"][data-points]')?.dataset.points >= 20",
            ),
            "alerts": (f"{base}/alerts", "document.querySelector('main') && document.readyState === 'complete'"),
        }
        try:
            with chromium() as browser:
                viewport = {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
                browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", viewport)
                browser.get(ui.url)  # the key, once
                for page in PAGES:
                    url, ready = urls[page]
                    if ui.request("GET", url.removeprefix(base)).status == 404:
                        print(f"{page}: not served by this tfrun ui, left out")
                        continue
                    size = shoot(browser, url, ready, args.out / f"ui-{page}.png")
                    print(f"{args.out / f'ui-{page}.png'}: {size / 1024:.0f} KB")
        finally:
            ui.stop()
    finally:
        stop.set()
        local.run("cancel", "--all", "--grace", "1")
        local.cleanup()
        box.cleanup()
        sshd.stop()


if __name__ == "__main__":
    main()
