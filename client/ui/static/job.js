// A job's page: its record, its loss and every other metric by step, its alerts and checkpoints (the `job`
// feed), its log followed with the filters in the URL (the `log` feed: they run on the box), and cancel and
// restart, each confirmed.
"use strict";

const [, , boxName, jobId] = location.pathname.split("/").map(decodeURIComponent);
const base = `${encodeURIComponent(boxName)}/${jobId}`;
const MAX_LINES = 5000; // lines kept on the page; the log itself is whole on the box (tfrun logs)
let job = null;
let clock = 0; // the server's clock less this browser's: the runtime counts on between records
// the steps, and each metric's value at each (common.js's addSamples, zoomInto)
const samples = newSamples();
const charts = new Map(); // chart id -> { plot, names, zoomed }
let drawing = false;

function showRecord(record) {
  job = record;
  clock = record.now - Date.now() / 1000;
  document.title = `tfrun: job ${record.id} on ${record.box}`;
  document.getElementById("where").textContent = record.box;
  document.getElementById("title").replaceChildren(`job ${record.id}${record.name ? " " + record.name : ""} `,
    el("span", { class: "state-" + record.state, id: "state" }, record.state));
  const rows = [
    ["box", record.box], ["state", record.state + (record.cause ? ` (${record.cause})` : "")],
    ["why", record.reason || record.waiting], ["exit code", record.exit_code ?? (record.signal ? `signal ${record.signal}` : null)],
    ["command", (record.command || []).join(" ")], ["script", [record.script, ...record.args].join(" ")],
    ["--env names", record.env_names.join(" ") || "none"], ["GPUs", (record.gpus || []).join(", ")],
    ["snapshot", record.git_commit ? record.git_commit.slice(0, 12) + (record.git_dirty ? " (dirty)" : "") : record.source],
    ["runtime", runtime(record, Date.now() / 1000 + clock)], ["created", new Date(record.created_at * 1000).toLocaleString()],
    ["restart of", record.restart_of], ["restarted as", record.restarted_as],
    ["array", record.array_id != null ? `job ${record.array_id}, task ${record.array_index}` : null],
  ];
  document.getElementById("record").replaceChildren(...rows.filter(([, value]) => value != null && value !== "")
    .flatMap(([name, value]) => [el("dt", {}, name), el("dd", name === "runtime" ? { id: "runtime" } : {}, value)]));
  const final = ["succeeded", "failed", "cancelled", "lost"].includes(record.state);
  document.getElementById("cancel").hidden = final;
  document.getElementById("restart").hidden = !final;
}

function addPoints(points) {
  addSamples(samples, points);
  redraw();
}

function redraw() { if (!drawing) { drawing = true; requestAnimationFrame(drawCharts); } }

// A chart zoomed in (or out: back to all its steps): its samples of the steps now shown (common.js's zoomInto).
function zoomed(plot, id) {
  const chart = charts.get(id);
  if (!chart) return;
  chart.zoomed = zoomInto(plot, samples, `/api/metrics/${base}`, redraw,
    (message) => { document.getElementById("notice").textContent = message; });
}

// The loss chart (the training loss and its validation counterpart), then one chart for each other metric:
// training ones, and evaluation ones apart, as `tfrun metrics` tells them apart.
function drawCharts() {
  drawing = false;
  const names = [...samples.columns.keys()];
  const train = trainingLoss(names);
  const lossNames = train ? [train, "val_" + train.replace(/^train_/, "")].filter((name) => samples.columns.has(name)) : [];
  if (lossNames.length) {
    document.getElementById("nochart").hidden = true;
    drawChart(document.getElementById("chart"), "loss", lossNames, 300);
  }
  const rest = names.filter((name) => !lossNames.includes(name)).sort();
  for (const [id, wanted] of [["train-charts", rest.filter((name) => !isEvaluation(name))],
                              ["eval-charts", rest.filter(isEvaluation)]]) {
    const section = document.getElementById(id);
    section.closest("section").hidden = !wanted.length;
    for (const name of wanted) {
      let box = [...section.children].find((child) => child.dataset.metric === name);
      if (!box) {
        box = el("div", { class: "small-chart", "data-metric": name, "data-points": "0" });
        section.append(box);
      }
      drawChart(box, "metric:" + name, [name], 180);
    }
  }
}

function drawChart(box, id, names, height) {
  const data = [samples.steps, ...names.map((name) => samples.columns.get(name))];
  const shown = charts.get(id);
  if (shown && shown.names.join() === names.join()) shown.plot.setData(data, !shown.zoomed);
  else {
    if (shown) shown.plot.destroy();
    const width = Math.min(names.length > 1 || height > 200 ? 900 : 440, box.clientWidth || 900);
    const chart = { names, zoomed: false };
    charts.set(id, chart);
    chart.plot = new uPlot({ width, height, scales: { x: { time: false } },
      hooks: { setScale: [(plot, key) => { if (key === "x") zoomed(plot, id); }] },
      series: [{ label: "step" }, ...names.map((name, i) => lineOf(name, PALETTE[i % PALETTE.length]))] }, data, box);
  }
  box.dataset.points = String(data[1].filter((value) => value != null).length);
  box.dataset.last = String(samples.steps[samples.steps.length - 1]);
}

// A metric's line (not across a value that was not a number: a gap); an evaluation's with its points shown: it
// has a value every epoch, not every step.
function lineOf(name, stroke) {
  const line = { label: name, stroke };
  if (isEvaluation(name)) line.points = { show: true, size: 4 };
  return line;
}

function showExtras(extras) {
  const alerts = document.getElementById("alerts");
  alerts.replaceChildren(...extras.alerts.map((alert) => alertItem(alert, false)));
  document.getElementById("noalerts").hidden = extras.alerts.length > 0;
  const body = document.querySelector("#checkpoints tbody");
  body.replaceChildren(...extras.checkpoints.map((point) => el("tr", { "data-name": point.name },
    el("td", {}, point.name), el("td", { class: "num" }, point.step ?? "-"), el("td", {}, point.saved),
    el("td", { class: "num" }, point.size))));
  document.getElementById("checkpoints").hidden = !extras.checkpoints.length;
  document.getElementById("nocheckpoints").textContent = extras.checkpoints.length ? "" : (extras.checkpoints_why || "no checkpoints");
}

let log = null;
function followLog() {
  const filters = new FormData(document.getElementById("filters"));
  const query = new URLSearchParams();
  for (const [key, value] of filters) if (value && value !== "0") query.set(key, value);
  history.replaceState(null, "", location.pathname + (query.toString() ? "?" + query : ""));
  if (log) log.close();
  const pre = document.getElementById("log");
  pre.replaceChildren();
  const notice = document.getElementById("lognotice");
  log = follow(`/events/log/${base}?${query}`, {
    lines: (lines) => {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(lines.join("\n") + "\n");
      while (pre.childNodes.length > MAX_LINES / 10) pre.firstChild.remove();
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    },
    notice: (data) => { notice.textContent = data.message; },
    end: (end) => { notice.textContent = end ? `the job ended: ${end.state}` : "the log ended"; },
  }, (message) => { notice.textContent = message; });
}

// The job's GPUs over its life, as its daemon sampled them (client/ui/feeds.py's `gpus`): each GPU's memory in
// GB and its load in %, by time, and the peak of each (what the next run's memory is sized by).
const gpuUse = { times: [], devices: new Map() }; // device -> { used: [], load: [], total }
const gpuCharts = {};
function addGpuUse(found) {
  for (const sample of found.samples) {
    if (!gpuUse.devices.has(sample.device)) gpuUse.devices.set(sample.device, { used: new Array(gpuUse.times.length).fill(undefined),
      load: new Array(gpuUse.times.length).fill(undefined), total: sample.total });
    const last = gpuUse.times.length - 1;
    if (last < 0 || gpuUse.times[last] !== sample.time) {
      gpuUse.times.push(sample.time);
      for (const series of gpuUse.devices.values()) { series.used.push(undefined); series.load.push(undefined); }
    }
    const series = gpuUse.devices.get(sample.device);
    series.used[series.used.length - 1] = sample.used / 1e9;
    series.load[series.load.length - 1] = sample.load ?? undefined;
  }
  document.getElementById("gpu-section").hidden = !gpuUse.times.length;
  const devices = [...gpuUse.devices.keys()];
  for (const [id, what, label, title] of [["gpu-memory", "used", "GB", "memory in use (GB)"], ["gpu-load", "load", "%", "load (%)"]]) {
    const data = [gpuUse.times, ...devices.map((device) => gpuUse.devices.get(device)[what])];
    const box = document.getElementById(id);
    if (gpuCharts[id] && gpuCharts[id].devices === devices.join()) gpuCharts[id].plot.setData(data);
    else {
      if (gpuCharts[id]) gpuCharts[id].plot.destroy();
      gpuCharts[id] = { devices: devices.join(), plot: new uPlot({ title, width: Math.min(440, box.clientWidth || 440), height: 180,
        series: [{ label: "time" }, ...devices.map((device, i) => ({ label: `GPU ${device} ${label}`, stroke: PALETTE[i % PALETTE.length], spanGaps: true }))],
        scales: { y: what === "load" ? { range: [0, 100] } : {} } }, data, box) };
    }
    box.dataset.points = String(data.slice(1).reduce((count, values) => count + values.filter((v) => v != null).length, 0));
  }
  document.getElementById("gpu-peak").textContent = devices.map((device) => {
    const series = gpuUse.devices.get(device), peak = Math.max(...series.used.filter((v) => v != null));
    return `GPU ${device}: peak memory ${peak.toFixed(1)} GB of ${(series.total / 1e9).toFixed(1)} GB`;
  }).join("; ");
}

async function act(action) {
  const what = action === "cancel" ? `Cancel job ${jobId} on ${boxName}?` : `Run job ${jobId} on ${boxName} again, as a new job?`;
  if (!confirm(what)) return;
  const acted = document.getElementById("acted");
  acted.textContent = action === "cancel" ? "cancelling..." : "restarting...";
  const reply = await fetch(`/api/job/${base}/${action}`, { method: "POST" });
  const result = reply.ok ? await reply.json() : { ok: false, message: (await reply.text()).trim() };
  acted.textContent = result.message;
  if (result.ok && result.job) location.assign(`/job/${encodeURIComponent(boxName)}/${result.job}`);
}

async function start() {
  const view = await (await fetch("/api/view")).json();
  document.getElementById("actions").hidden = view.read_only;
  document.getElementById("cancel").addEventListener("click", () => act("cancel"));
  document.getElementById("restart").addEventListener("click", () => act("restart"));
  const params = new URLSearchParams(location.search);
  for (const key of ["grep", "C"]) if (params.get(key)) document.getElementById(key).value = params.get(key);
  for (const key of ["i", "v", "F"]) document.getElementById(key).checked = params.get(key) === "1";
  const form = document.getElementById("filters");
  form.addEventListener("change", followLog);
  form.addEventListener("submit", (event) => { event.preventDefault(); followLog(); });
  const notice = document.getElementById("notice");
  follow(`/events/job/${base}`, { job: showRecord, points: addPoints, extras: showExtras, gpus: addGpuUse }, (message) => { notice.textContent = message; });
  followLog();
  setInterval(() => {
    const shown = document.getElementById("runtime");
    if (job && shown) shown.textContent = runtime(job, Date.now() / 1000 + clock);
  }, 1000);
}

start();
