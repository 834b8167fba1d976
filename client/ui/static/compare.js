// The Compare page: the jobs of ?jobs=BOX:ID,BOX:ID (or ?array=BOX:ID: an array's tasks), one metric of all of
// them by step in one chart (log scale, smoothing as TensorBoard's), and a table of their arguments (an array's
// values among them) and each metric's final and best value, sorted by any column. All of it is in the URL.
// One stream carries every job's record and metrics (the `compare` feed: the jobs' own feeds, joined).
"use strict";

const params = new URLSearchParams(location.search);
const view = {
  metric: params.get("metric") || "", log: params.get("log") === "1",
  smooth: Math.min(0.99, Math.max(0, parseFloat(params.get("smooth")) || 0)),
  sort: params.get("sort") || "", desc: params.get("desc") === "1",
};
const LOWER_IS_BETTER = new Set(["loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer", "nll"]);
const HIGHER_IS_BETTER = new Set(["acc", "accuracy", "auc", "f1", "precision", "recall", "bleu", "rouge", "iou", "map",
  "top1", "top5", "r2", "score", "reward"]);
let runs = []; // { ref, box, id, record, trouble, samples: { steps, columns } }, in the URL's order
let chart = null, chartKey = "", drawing = false, chartZoomed = false;
let shortened = ""; // an array of more jobs than a page compares: which of them it shows

function refUrl(refs) { return refs.map((ref) => encodeURIComponent(ref).replace(/%3A/g, ":")).join(","); }

function keepInUrl() {
  const shown = [`jobs=${refUrl(runs.map((run) => run.ref))}`];
  if (view.metric) shown.push(`metric=${encodeURIComponent(view.metric)}`);
  if (view.log) shown.push("log=1");
  if (view.smooth) shown.push(`smooth=${view.smooth}`);
  if (view.sort) shown.push(`sort=${encodeURIComponent(view.sort)}` + (view.desc ? "&desc=1" : ""));
  history.replaceState(null, "", "/compare?" + shown.join("&"));
}

// ?array=BOX:ID: the ids of that array's tasks, asked of the server (it lists the box's jobs since the array).
async function arrayRefs(ref) {
  const at = ref.lastIndexOf(":");
  const box = ref.slice(0, at), id = ref.slice(at + 1);
  if (at < 1 || !/^[0-9]+$/.test(id)) throw new Error(`array ${ref} is not BOX:ID (e.g. local:12)`);
  const reply = await fetch(`/api/array/${encodeURIComponent(box)}/${id}`);
  const found = reply.ok ? await reply.json() : { ok: false, message: (await reply.text()).trim() };
  if (!found.ok) throw new Error(found.message);
  if (!found.jobs.length) throw new Error(`${box} has no array ${id}`);
  if (found.tasks > found.jobs.length) shortened = `the first ${found.jobs.length} of the array's ${found.tasks} jobs`;
  return found.jobs.map((job) => `${box}:${job}`);
}

function later() { if (!drawing) { drawing = true; requestAnimationFrame(draw); } }

function draw() {
  drawing = false;
  const names = metricNames();
  if (!view.metric && names.length) {
    view.metric = trainingLoss(names) || names[0];
    keepInUrl();
  }
  const select = document.getElementById("metric");
  const options = names.includes(view.metric) || !view.metric ? names : [view.metric, ...names];
  if ([...select.options].map((option) => option.value).join("\n") !== options.join("\n")) {
    select.replaceChildren(...options.map((name) => el("option", { value: name }, name)));
  }
  select.value = view.metric;
  drawChart();
  drawTable(names);
  const troubles = runs.filter((run) => run.trouble).map((run) => `${run.ref}: ${run.trouble}`);
  document.getElementById("notice").textContent = [shortened, ...troubles].filter(Boolean).join("; ");
}

// Every metric the jobs have: the training loss first, evaluation metrics after the others (as `tfrun metrics`).
function metricNames() {
  const names = new Set();
  for (const run of runs) for (const name of run.samples.columns.keys()) names.add(name);
  const train = trainingLoss([...names]);
  return [...names].sort((a, b) => (a !== train) - (b !== train) || isEvaluation(a) - isEvaluation(b) || a.localeCompare(b));
}

// TensorBoard's smoothing: an exponential moving average, debiased (its first values are not pulled to 0).
function smoothed(values, weight) {
  if (!weight) return values;
  let last = 0, count = 0;
  return values.map((value) => {
    if (value == null || !isFinite(value)) return value;
    last = last * weight + (1 - weight) * value;
    count += 1;
    return last / (1 - Math.pow(weight, count));
  });
}

function drawChart() {
  const box = document.getElementById("chart");
  const tables = runs.map((run) => {
    const values = run.samples.columns.get(view.metric) || new Array(run.samples.steps.length).fill(null);
    const shown = smoothed(values, view.smooth);
    return [run.samples.steps, view.log ? shown.map((value) => (value > 0 ? value : null)) : shown];
  });
  const data = uPlot.join(tables);
  const labels = runs.map((run) => run.ref + (run.record && run.record.name ? " " + run.record.name : ""));
  const key = `${view.log}|${labels.join("\n")}`;
  if (chart && chartKey === key) chart.setData(data, !chartZoomed);
  else {
    if (chart) chart.destroy();
    chartZoomed = false;
    chart = new uPlot({
      width: Math.min(1100, box.clientWidth || 1100), height: 380,
      scales: { x: { time: false }, y: view.log ? { distr: 3 } : {} },
      hooks: { setScale: [(plot, key) => { if (key === "x") zoomed(plot); }] },
      series: [{ label: "step" }, ...labels.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], spanGaps: true }))],
    }, data, box);
    chartKey = key;
  }
}

// The chart zoomed in (or out): each job's samples of the steps now shown, where its first draw was thinned
// (common.js's zoomInto), and the zoom kept as points come.
function zoomed(plot) {
  const steps = plot.data[0], scale = plot.scales.x;
  chartZoomed = scale.min != null && steps.length > 0 && (scale.min > steps[0] || scale.max < steps[steps.length - 1]);
  for (const run of runs) {
    zoomInto(plot, run.samples, `/api/metrics/${encodeURIComponent(run.box)}/${run.id}`, later,
      (message) => { run.trouble = message; later(); });
  }
}

// What a job was given: its `--KEY=VALUE` arguments (an array's values are these) each a column, the rest as one.
function argsOf(record) {
  const keyed = {}, rest = [];
  for (const arg of (record && record.args) || []) {
    const match = /^--([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$/.exec(arg);
    if (match) keyed[match[1]] = match[2]; else rest.push(arg);
  }
  return { keyed, rest: rest.join(" ") };
}

// Whether a lower or a higher value of a metric is the better one, told by the words of its name; null: not told.
function direction(name) {
  const words = name.toLowerCase().split(/[^a-z0-9]+/);
  if (words.some((word) => LOWER_IS_BETTER.has(word))) return -1;
  if (words.some((word) => HIGHER_IS_BETTER.has(word))) return 1;
  return null;
}

function finalAndBest(run, name) {
  const values = (run.samples.columns.get(name) || []).filter((value) => value != null && isFinite(value));
  if (!values.length) return [null, null];
  const better = direction(name);
  const best = better == null ? null : better < 0 ? Math.min(...values) : Math.max(...values);
  return [values[values.length - 1], best];
}

function drawTable(names) {
  const keys = [...new Set(runs.flatMap((run) => Object.keys(argsOf(run.record).keyed)))].sort();
  const columns = [["job", "job"], ["name", "name"], ["state", "state"], ["args", "arguments"],
    ...keys.map((key) => [`arg:${key}`, key]),
    ...names.flatMap((name) => [[`final:${name}`, `${name} final`], [`best:${name}`, `${name} best`]])];
  const cells = runs.map((run) => {
    const args = argsOf(run.record), record = run.record || {};
    const row = { job: run.ref, name: record.name || "", state: run.trouble ? "unreachable" : record.state || "", args: args.rest };
    for (const key of keys) row[`arg:${key}`] = args.keyed[key] ?? null;
    for (const name of names) [row[`final:${name}`], row[`best:${name}`]] = finalAndBest(run, name);
    return { run, row };
  });
  if (view.sort) {
    const sign = view.desc ? -1 : 1;
    cells.sort((a, b) => ordered(a.row[view.sort], b.row[view.sort], sign));
  }
  document.querySelector("#runs thead tr").replaceChildren(...columns.map(([key, label]) => el("th",
    { "data-key": key, class: "sortable" + (view.sort === key ? (view.desc ? " desc" : " asc") : ""),
      title: key.startsWith("best:") && direction(key.slice(5)) == null ? "tfrun cannot tell from this name whether lower or higher is better" : "sort by this column" },
    label)));
  document.querySelector("#runs tbody").replaceChildren(...cells.map(({ run, row }) => el("tr", { "data-ref": run.ref },
    ...columns.map(([key]) => {
      const value = row[key];
      if (key === "job") return el("td", {}, el("a", { href: `/job/${encodeURIComponent(run.box)}/${run.id}` }, value));
      if (key === "state") return el("td", { class: "state-" + value, title: run.trouble || "" }, value);
      return el("td", typeof value === "number" ? { class: "num" } : {}, typeof value === "number" ? loss(value) : value ?? "-");
    }))));
}

// Numbers by value, words as people sort them (sweep-2 before sweep-10); an empty cell last either way.
function ordered(a, b, sign) {
  if (a == null || a === "") return b == null || b === "" ? 0 : 1;
  if (b == null || b === "") return -1;
  if (typeof a === "number" && typeof b === "number") return sign * (a - b);
  return sign * String(a).localeCompare(String(b), undefined, { numeric: true });
}

function followRuns() {
  const source = new EventSource("/events/compare?jobs=" + refUrl(runs.map((run) => run.ref)));
  const notice = document.getElementById("notice");
  const each = (kind, take) => source.addEventListener(kind, (event) => {
    const { job, data } = JSON.parse(event.data);
    take(runs[job], data);
    later();
  });
  each("job", (run, record) => { run.record = record; run.trouble = ""; });
  each("points", (run, points) => { addSamples(run.samples, points); run.trouble = ""; });
  each("trouble", (run, data) => { run.trouble = data.message; });
  source.addEventListener("refused", (event) => { notice.textContent = JSON.parse(event.data).message; source.close(); });
  source.addEventListener("ended", () => source.close());
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CONNECTING) notice.textContent = "reconnecting to the tfrun ui server...";
  });
}

async function start() {
  let refs = (params.get("jobs") || "").split(",").map((ref) => ref.trim()).filter(Boolean);
  try {
    if (params.get("array")) refs = await arrayRefs(params.get("array"));
  } catch (error) {
    document.getElementById("notice").textContent = error.message;
    return;
  }
  if (!refs.length) { document.getElementById("help").hidden = false; return; }
  runs = [];
  for (const given of refs) { // each job once, as the server takes them: the stream's events name them by place
    const at = given.lastIndexOf(":");
    const box = given.slice(0, at), id = /^[0-9]+$/.test(given.slice(at + 1)) ? String(Number(given.slice(at + 1))) : given.slice(at + 1);
    const ref = `${box}:${id}`;
    if (!runs.some((run) => run.ref === ref)) runs.push({ ref, box, id, record: null, trouble: "", samples: newSamples() });
  }
  document.getElementById("controls").hidden = false;
  document.getElementById("log").checked = view.log;
  document.getElementById("smooth").value = view.smooth;
  document.getElementById("smoothed").textContent = view.smooth;
  document.getElementById("controls").addEventListener("input", () => {
    view.metric = document.getElementById("metric").value;
    view.log = document.getElementById("log").checked;
    view.smooth = parseFloat(document.getElementById("smooth").value);
    document.getElementById("smoothed").textContent = view.smooth;
    keepInUrl();
    later();
  });
  document.querySelector("#runs thead").addEventListener("click", (event) => {
    const key = event.target.closest("th") && event.target.closest("th").dataset.key;
    if (!key) return;
    view.desc = view.sort === key ? !view.desc : false;
    view.sort = key;
    keepInUrl();
    later();
  });
  keepInUrl();
  followRuns();
}

start();
