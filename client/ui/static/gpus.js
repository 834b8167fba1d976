// The GPUs page: for each box, its GPUs now (memory, load, the job holding each) and charts of their memory and
// load since the page opened, up to the last hour (the `gpus` feed samples each box once a second, as `tfrun
// top` does, and gives a page that joins the history it kept).
"use strict";

const HISTORY_S = 3600;
const boxes = new Map(); // box -> { last, times, memory: Map device -> [%], load: Map device -> [%], charts }
let drawing = false;

function percent(used, total) { return used == null || !total ? null : (100 * used) / total; }

function record(sample) {
  if (!boxes.has(sample.box)) boxes.set(sample.box, { times: [], memory: new Map(), load: new Map(), charts: {} });
  const box = boxes.get(sample.box);
  box.last = sample;
  const index = box.times.length;
  box.times.push(sample.at);
  for (const gpu of sample.gpus) {
    for (const [series, value] of [[box.memory, percent(gpu.used, gpu.total)], [box.load, gpu.load]]) {
      if (!series.has(gpu.device)) series.set(gpu.device, new Array(index).fill(null));
      series.get(gpu.device)[index] = value ?? null;
    }
  }
  for (const series of [box.memory, box.load]) for (const values of series.values()) if (values.length <= index) values.push(null);
  const old = box.times.findIndex((at) => at >= sample.at - HISTORY_S);
  if (old > 0) {
    box.times.splice(0, old);
    for (const series of [box.memory, box.load]) for (const values of series.values()) values.splice(0, old);
  }
  if (!drawing) { drawing = true; requestAnimationFrame(draw); }
}

function draw() {
  drawing = false;
  const shown = document.getElementById("boxes");
  for (const [name, box] of boxes) {
    let section = [...shown.children].find((child) => child.dataset.box === name);
    if (!section) {
      section = el("section", { class: "gpu-box", "data-box": name }, el("h2", {}, name), el("div", { class: "state" }),
        el("table", { class: "gpus" }), el("div", { class: "charts" }));
      shown.append(section);
    }
    const sample = box.last;
    section.querySelector(".state").textContent = !sample.up ? `down: ${sample.why}`
      : sample.gpus.length ? "" : "no GPUs on this box (or none NVML can see)";
    section.querySelector(".state").className = "state" + (sample.up ? " dim" : " down");
    const table = section.querySelector("table");
    table.hidden = !sample.gpus.length;
    table.replaceChildren(el("thead", {}, el("tr", {}, ...["GPU", "name", "memory", "use", "job"].map((label) => el("th", {}, label)))),
      el("tbody", {}, ...sample.gpus.map((gpu) => el("tr", { "data-device": gpu.device },
        el("td", {}, gpu.device), el("td", {}, gpu.name || "-"), el("td", { class: "num" }, gpu.memory),
        el("td", { class: "num" }, gpu.load == null ? "-" : `${gpu.load}%`), holder(name, gpu)))));
    const charts = section.querySelector(".charts");
    for (const [key, title] of [["memory", "memory in use (%)"], ["load", "load (%)"]]) {
      const devices = [...box[key].keys()];
      if (!devices.length) continue;
      const data = [box.times, ...devices.map((device) => box[key].get(device))];
      const chart = box.charts[key];
      if (chart && chart.devices.join() === devices.join()) chart.plot.setData(data);
      else {
        if (chart) chart.plot.destroy();
        const place = el("div", { class: "small-chart", "data-chart": key });
        charts.querySelector(`[data-chart="${key}"]`)?.remove();
        charts.append(place);
        box.charts[key] = { devices, plot: new uPlot({ title, width: 440, height: 180, scales: { y: { range: [0, 100] } },
          series: [{ label: "time" }, ...devices.map((device, i) => ({ label: `GPU ${device}`, stroke: PALETTE[i % PALETTE.length], spanGaps: false }))] },
        data, place) };
      }
      charts.querySelector(`[data-chart="${key}"]`).dataset.points = String(box.times.length);
    }
  }
}

// Who holds a GPU: a job of this box (its page), or who holds it outside tfrun here, in `tfrun gpus`' words.
function holder(box, gpu) {
  if (gpu.job != null) {
    return el("td", { class: "holder" }, el("a", { href: `/job/${encodeURIComponent(box)}/${gpu.job}` },
      `job ${gpu.job}${gpu.job_name ? " " + gpu.job_name : ""}`));
  }
  return el("td", { class: "holder" }, gpu.held_by ? `held by ${gpu.held_by}` : "-");
}

const notice = document.getElementById("notice");
follow("/events/gpus", { sample: record }, (message) => { notice.textContent = message; });
