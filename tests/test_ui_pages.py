"""`tfrun ui`'s pages beyond the jobs table (issue 46): Compare, Alerts, GPUs, and a job's every metric, alerts
and checkpoints, in a real browser against real daemons.

Two boxes: this machine's daemon, whose GPUs are the tests' stand-in (TFRUN_GPU_STANDIN: two of them, one
leased to a job), whose alerts go to a real HTTP receiver, and which ran an array of two training tasks and a
job whose loss went NaN; and a box over the tests' sshd with no GPU. One `tfrun ui` shows both, one headless
Chromium reads it (tests/harness/browser.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from harness import Receiver, Sshd, Tfrun, remote_client, wait_for, write_script
from harness.alerting import configure
from harness.browser import UiServer, attribute_of, attributes_of, by_css, click, signed_in, start_ui, text_of

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

pytestmark = [pytest.mark.ssh, pytest.mark.browser, pytest.mark.slow]

STEPS = 40  # each task's training steps; an evaluation and a checkpoint every 5
GIB = 1 << 30
HOLDER = "<i>holder</i>"  # a name that is markup: the page shows it as text

# Trains for STEPS steps: a loss (lower with a smaller --lr) and an accuracy each step, an evaluation's every 5
# with a checkpoint (TensorFlow's two files of one) saved in the job's checkpoint folder.
_TRAINER = f"""
import os, sys, time
lr = float(next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--lr=")), "0.1"))
for step in range(1, {STEPS} + 1):
    print(f"step {{step}} loss={{lr + 1.0 / step:.6f}} accuracy={{1 - 1.0 / step:.4f}}", flush=True)
    if step % 5 == 0:
        print(f"step {{step}} val_loss={{lr + 1.2 / step:.6f}} val_accuracy={{0.9 - 1.0 / step:.4f}}", flush=True)
        for part in (".index", ".data-00000-of-00001"):
            open(os.path.join(os.environ["TFRUN_CHECKPOINT_DIR"], f"ckpt-{{step}}{{part}}"), "w").write("x")
    time.sleep(0.02)
"""
_NAN = "".join(f"print('step {step} loss={loss}', flush=True)\n" for step, loss in ((1, 0.7), (2, 0.69), (3, "nan")))


@dataclass
class Boxes:
    local: Tfrun
    box: Tfrun
    receiver: Receiver
    tasks: list[int]  # the array's two tasks, lr=0.1 and lr=0.2
    nan_job: int
    holder: int  # the job given a stand-in GPU


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory, sshd: Sshd) -> Iterator[Boxes]:
    folder = tmp_path_factory.mktemp("ui-pages")
    client = folder / "client-home"
    box = remote_client(Tfrun(folder / "box-home", client_home=client), sshd)
    none = folder / "no-gpus.json"
    none.write_text("[]")  # the box's GPUs: none, whatever this machine has
    config = client / ".config" / "tfrun" / "config.toml"
    config.write_text(config.read_text().replace("env = { ", f"env = {{ TFRUN_GPU_STANDIN = {json.dumps(str(none))}, "))
    local = Tfrun(folder / "local-home", client_home=client)
    receiver = Receiver()
    configure(local, receiver.url)
    gpus = [{"index": i, "name": "NVIDIA H200", "used": (30 + i) * GIB, "total": 141 * GIB, "utilization": 40 + i,
             "uuid": f"GPU-{i}"} for i in range(2)]  # fmt: skip
    (folder / "nvml.json").write_text(json.dumps(gpus))
    local.env["TFRUN_GPU_STANDIN"] = str(folder / "nvml.json")
    project = folder / "project"
    project.mkdir()
    write_script(project, "train.py", _TRAINER)
    write_script(project, "nan.py", _NAN + "raise SystemExit(1)\n")
    write_script(project, "hold.py", "import time\ntime.sleep(600)\n")
    try:
        tasks = [int(line) for line in local.ok("submit", "--name", "sweep", "--array", "lr=0.1,0.2",
                                                str(project / "train.py")).split()]  # fmt: skip
        nan_job = local.submit("--no-alert", "failed", str(project / "nan.py"))
        holder = local.submit("--name", HOLDER, "--gpus", "1", str(project / "hold.py"))
        for job in (*tasks, nan_job):
            local.run("wait", str(job))
        yield Boxes(local, box, receiver, tasks, nan_job, holder)
    finally:
        box.cleanup()
        local.cleanup()
        receiver.stop()


@pytest.fixture(scope="module")
def ui(boxes: Boxes) -> Iterator[UiServer]:
    server = start_ui(boxes.local.env, boxes.local.home.parent)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(ui: UiServer) -> Iterator[WebDriver]:
    with signed_in(ui) as driver:
        yield driver


def _series(browser: WebDriver) -> list[int]:
    """The points of each series the Compare chart's uPlot holds (its data less the steps)."""
    held = "return typeof chart === 'undefined' || !chart ? [] : chart.data.slice(1)"
    return list(browser.execute_script(held + ".map((s) => s.filter((v) => v != null).length)"))


def test_compare_shows_the_array_s_two_curves(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    """An array is one click on the jobs page; the page is its URL; each metric's final and best per job."""
    first, second = boxes.tasks
    browser.get(ui.base + "/")
    link = f'tr[data-box="local"][data-id="{first}"] a.compare-array'
    click(browser, link, "the array's compare link")
    wait_for(lambda: _series(browser) == [STEPS, STEPS], timeout=30, what="both tasks' losses in the chart")
    assert browser.current_url == f"{ui.base}/compare?jobs=local:{first},local:{second}&metric=loss"
    rows = _table(browser)
    assert [row["job"] for row in rows] == [f"local:{first}", f"local:{second}"] and rows[0]["lr"] == "0.1"
    assert float(rows[1]["loss final"]) == pytest.approx(0.2 + 1 / STEPS) == float(rows[1]["loss best"])
    assert float(rows[0]["accuracy best"]) == pytest.approx(1 - 1 / STEPS)  # higher is better: the max
    for _ in range(2):  # sorted by lr, then the other way (a click in the page: its table is redrawn as it goes)
        browser.execute_script("document.querySelector('th[data-key=\"arg:lr\"]').click()")
    wait_for(lambda: [row["lr"] for row in _table(browser)] == ["0.2", "0.1"], what="sorted by lr, descending")
    browser.get(f"{ui.base}/compare?jobs=local:{first},local:{second}&metric=val_accuracy&log=1&smooth=0.6")
    wait_for(lambda: _series(browser) == [STEPS // 5, STEPS // 5], timeout=30, what="the evaluations, log scale")
    assert by_css(browser, "#log")[0].is_selected() and attribute_of(browser, "#metric", "value") == "val_accuracy"


def _table(browser: WebDriver) -> list[dict[str, str]]:
    """The Compare table's rows, each by its column's heading, read at once (the page redraws it as it goes)."""
    read = """const heads = [...document.querySelectorAll('#runs thead th')].map((th) => th.textContent);
        return [...document.querySelectorAll('#runs tbody tr')].map((tr) =>
            Object.fromEntries([...tr.children].map((td, i) => [heads[i], td.textContent])));"""
    return list(browser.execute_script(read))


def test_compare_takes_the_jobs_ticked_and_says_what_it_cannot_show(
    browser: WebDriver, ui: UiServer, boxes: Boxes
) -> None:
    browser.get(ui.base + "/")
    for job in (boxes.tasks[1], boxes.nan_job):
        tick = f'tr[data-box="local"][data-id="{job}"] input.pick'
        click(browser, tick, "the row's tick box")
    click(browser, "#compare", "the compare button")
    wait_for(lambda: _series(browser) == [STEPS, 2], timeout=30, what="both jobs' losses (the NaN is no point)")
    assert f"jobs=local:{boxes.tasks[1]},local:{boxes.nan_job}" in browser.current_url
    first, second = boxes.tasks
    browser.get(f"{ui.base}/compare?jobs=local:{first},local:0{first},%20local:{second}")  # one job named twice
    wait_for(lambda: _series(browser) == [STEPS, STEPS], timeout=30, what="each job once, each its own curve")
    browser.get(f"{ui.base}/compare?jobs=nowhere:1")
    wait_for(lambda: "no box 'nowhere' here" in (text_of(browser, "#notice") or ""), what="the refusal in words")


def test_compare_is_live_while_a_job_runs(browser: WebDriver, ui: UiServer, boxes: Boxes, tmp_path: Path) -> None:
    write_script(tmp_path, "slow.py", "import time\nfor step in range(1, 600):\n"
                 "    print(f'step {step} loss={1 / step}', flush=True)\n    time.sleep(0.1)\n")  # fmt: skip
    job = boxes.local.submit(str(tmp_path / "slow.py"))
    try:
        browser.get(f"{ui.base}/compare?jobs=local:{boxes.tasks[0]},local:{job}")
        first = wait_for(
            lambda: _series(browser)[1:] and _series(browser)[1], timeout=30, what="the running job's curve"
        )
        wait_for(lambda: _series(browser)[1] >= first + 10, timeout=20, what="its curve to grow in the page")
        assert _series(browser)[0] == STEPS
    finally:
        boxes.local.run("cancel", str(job))


def test_the_alerts_page_lists_a_nan_alert_with_its_delivery(browser: WebDriver, ui: UiServer, boxes: Boxes) -> None:
    browser.get(ui.base + "/alerts")
    item = f'li.alert[data-box="local"][data-job="{boxes.nan_job}"][data-rule="spike"]'
    wait_for(lambda: by_css(browser, f"{item} li[data-state=sent]"), timeout=30, what="the alert, delivered")
    text = text_of(browser, item) or ""
    assert "loss is nan at step 3" in text and f"sent json://127.0.0.1:{boxes.receiver.port}/*** at " in text, text
    assert attribute_of(browser, f"{item} a.where", "href") == f"{ui.base}/job/local/{boxes.nan_job}"
    assert text_of(browser, f"{item} a.where") == f"local:{boxes.nan_job}"
    assert "box: up" in (text_of(browser, "#boxes") or "")
    assert ui.request("GET", "/events/alerts", cookie=False).status == 403  # the new pages are behind the key too


def test_the_gpus_page_shows_each_box_s_gpus_and_the_job_holding_one(
    browser: WebDriver, ui: UiServer, boxes: Boxes
) -> None:
    browser.get(ui.base + "/gpus")
    local = 'section[data-box="local"]'
    wait_for(lambda: len(by_css(browser, f"{local} table.gpus tbody tr")) == 2, what="the stand-in's two GPUs")
    held = boxes.local.job(boxes.holder)["gpus"]
    row = text_of(browser, f'{local} tr[data-device="{held[0]}"]') or ""
    assert f"job {boxes.holder} {HOLDER}" in row and "NVIDIA H200" in row, row
    assert not by_css(browser, f"{local} table i"), "a job's name is text, never markup"
    assert "(21%)" in (text_of(browser, f'{local} tr[data-device="0"]') or "")  # 30 of 141 GiB, as `tfrun gpus`
    box_state = 'section[data-box="box"] .state'
    state = wait_for(lambda: text_of(browser, box_state), timeout=30, what="the box's section")
    assert state == "no GPUs on this box (or none NVML can see)"
    chart = f'{local} [data-chart="memory"]'
    wait_for(lambda: _points(browser, chart) >= 3, timeout=10, what="the memory history to grow")


def test_a_job_page_charts_its_gpus_memory_and_load_over_its_life(
    browser: WebDriver, ui: UiServer, boxes: Boxes
) -> None:
    """The daemon samples the GPUs a job holds into its folder (runner/gpus/history.py); its page charts
    them by time with the peak, which is what the next run's memory is sized by."""
    device = boxes.local.job(boxes.holder)["gpus"][0]
    browser.get(f"{ui.base}/job/local/{boxes.holder}")
    wait_for(lambda: _points(browser, "#gpu-memory") >= 2, timeout=30, what="two samples of the held GPU")
    assert _points(browser, "#gpu-load") == _points(browser, "#gpu-memory")
    used = (30 + int(device)) * GIB / 1e9  # the stand-in's figures for that GPU, in `tfrun gpus`' units
    assert text_of(browser, "#gpu-peak") == f"GPU {device}: peak memory {used:.1f} GB of {141 * GIB / 1e9:.1f} GB"
    loads = browser.execute_script("return gpuCharts['gpu-load'].plot.data[1].filter((v) => v != null)")
    assert set(loads) == {40 + int(device)}
    samples = [json.loads(line) for line in (boxes.local.job_dir(boxes.holder) / "gpus.jsonl").read_text().splitlines()]
    assert {sample["device"] for sample in samples} == {device}, "only the GPU the job holds"
    for other in (boxes.tasks[0], boxes.nan_job):  # jobs that hold none: no samples, no section
        assert not (boxes.local.job_dir(other) / "gpus.jsonl").exists()
    browser.get(f"{ui.base}/job/local/{boxes.tasks[0]}")
    wait_for(lambda: _points(browser, "#chart") > 0, timeout=30, what="the task's page")
    assert not by_css(browser, "#gpu-section")[0].is_displayed()


def test_a_job_page_charts_every_metric_and_lists_alerts_and_checkpoints(
    browser: WebDriver, ui: UiServer, boxes: Boxes
) -> None:
    browser.get(f"{ui.base}/job/local/{boxes.tasks[0]}")
    evaluation = '#eval-charts [data-metric="val_accuracy"]'
    wait_for(lambda: _points(browser, evaluation) == STEPS // 5, timeout=30, what="the evaluation's chart")
    assert _points(browser, '#train-charts [data-metric="accuracy"]') == STEPS
    assert not by_css(browser, '#train-charts [data-metric^="val_"]'), "evaluations apart from training metrics"
    assert _points(browser, "#chart") == STEPS
    wait_for(lambda: by_css(browser, "#checkpoints tbody tr"), what="its checkpoints")
    names = attributes_of(browser, "#checkpoints tbody tr", "data-name")
    assert names == [f"ckpt-{step}" for step in range(STEPS, 0, -5)], names  # newest first, one row each
    rules = [alert["rule"] for alert in json.loads(boxes.local.ok("alerts", "--json", str(boxes.tasks[0])))]
    wait_for(
        lambda: attributes_of(browser, "#alerts li.alert", "data-rule") == rules,
        what="its alerts, as `tfrun alerts` lists them",
    )
    browser.get(f"{ui.base}/job/local/{boxes.nan_job}")
    wait_for(lambda: by_css(browser, '#alerts li.alert[data-rule="spike"] li[data-state="sent"]'), timeout=30,
             what="its alert, delivered")  # fmt: skip
    assert text_of(browser, "#nocheckpoints") == "no checkpoints"
    errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]  # type: ignore[no-untyped-call]
    assert not errors, errors


def _points(browser: WebDriver, css: str) -> int:
    points = attribute_of(browser, css, "data-points")
    return -1 if points is None else int(points or 0)


def test_a_compare_stream_resumes_each_job_where_the_page_had_it(ui: UiServer, boxes: Boxes) -> None:
    """One stream carries both jobs; its event id is each job's feed's number, so a stream opened again with the
    last id the page had (as the browser does) sends only what came after, of each job (an ended job's feed
    asks for its record once more: a restart may have changed it)."""
    path = f"/events/compare?jobs=local:{boxes.tasks[0]},local:{boxes.tasks[1]}"
    whole = _events(ui.request("GET", path).body)
    assert whole[-1][1] == "ended" and {data["job"] for _, kind, data in whole if kind == "points"} == {0, 1}
    cut = next(i for i, (_, kind, data) in enumerate(whole) if kind == "points" and data["job"] == 1)
    rest = _events(ui.request("GET", path, {"Last-Event-ID": whole[cut][0]}).body)
    points = [(kind, data) for _, kind, data in whole[cut + 1 :] if kind == "points"]
    assert [(kind, data) for _, kind, data in rest if kind == "points"] == points  # none again, none lost
    had = [int(number) for number in whole[cut][0].split(".")]
    for number, _, data in rest[:-1]:  # each event of a job is newer than what the page had of that job
        assert int(number.split(".")[data["job"]]) > had[data["job"]], (number, had)
    refused = _events(ui.request("GET", "/events/compare?jobs=local:x").body)
    assert refused == [("0", "refused", {"message": "'local:x' is not BOX:ID (e.g. local:12)"})]


def _events(body: bytes) -> list[tuple[str, str, Any]]:
    """A stream's events as (id, kind, data)."""
    found = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            found.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return found
