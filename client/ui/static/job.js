// A job's page: its record and its loss by step (the `job` feed), its log followed with the filters in the
// URL (the `log` feed: they run on the box), and cancel and restart, each confirmed.
"use strict";

const [, , boxName, jobId] = location.pathname.split("/").map(decodeURIComponent);
const base = `${encodeURIComponent(boxName)}/${jobId}`;
const MAX_LINES = 5000; // lines kept on the page; the log itself is whole on the box (tfrun logs)
const EVALUATION = ["val", "test", "eval"];
let job = null;
let clock = 0; // the server's clock less this browser's: the runtime counts on between records
let chart = null;
const steps = [], series = new Map(); // step index -> value, by metric name

function trainingLoss(names) {
  if (names.includes("loss")) return "loss";
  return names.find((name) => name.endsWith("loss") && !EVALUATION.some((p) => name.startsWith(p))) || null;
}

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
    ["--env names", record.env_names.join(" ") || "none"],
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
  for (const point of points) {
    const index = steps.length;
    steps.push(point.step);
    for (const [name, value] of Object.entries(point.values)) {
      if (!series.has(name)) series.set(name, []);
      series.get(name)[index] = value;
    }
  }
  const train = trainingLoss([...series.keys()]);
  if (!train) return;
  const names = [train, "val_" + train.replace(/^train_/, "")].filter((name) => series.has(name));
  const data = [steps, ...names.map((name) => Array.from({ length: steps.length }, (_, i) => series.get(name)[i] ?? null))];
  const box = document.getElementById("chart");
  if (!chart) {
    document.getElementById("nochart").hidden = true;
    chart = new uPlot({ width: Math.min(900, box.clientWidth || 900), height: 300, scales: { x: { time: false } },
      series: [{ label: "step" }, ...names.map((name, i) => ({ label: name, stroke: i ? "#c60" : "#06c", spanGaps: true }))] },
      data, box);
  } else chart.setData(data);
  box.dataset.points = String(data[1].filter((value) => value != null).length);
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
  follow(`/events/job/${base}`, { job: showRecord, points: addPoints }, (message) => { notice.textContent = message; });
  followLog();
  setInterval(() => {
    const shown = document.getElementById("runtime");
    if (job && shown) shown.textContent = runtime(job, Date.now() / 1000 + clock);
  }, 1000);
}

start();
