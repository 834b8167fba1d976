// What both pages share: a live stream of a feed (server-sent events, reopened by the browser when it
// drops), times as `tfrun ps` shows them, and elements made without innerHTML (no job's text is markup).
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function duration(seconds) {
  if (seconds == null || seconds < 0) return "-";
  if (seconds < 60) return seconds.toFixed(1) + "s";
  const minutes = Math.floor(seconds / 60), secs = Math.floor(seconds % 60);
  if (minutes < 60) return `${minutes}m${String(secs).padStart(2, "0")}s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h${String(minutes % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d${String(hours % 24).padStart(2, "0")}h`;
}

function runtime(job, now) {
  if (job.started_at == null) return "-";
  return duration((job.finished_at ?? now) - job.started_at);
}

function loss(value) { return value == null ? "-" : Number(value).toPrecision(4).replace(/\.?0+$/, ""); }

// A trend line of the last losses, as `tfrun top` draws one with block characters.
function sparkline(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("width", "80"); svg.setAttribute("height", "18");
  const finite = values.filter((v) => v != null && isFinite(v));
  if (finite.length > 1) {
    const low = Math.min(...finite), high = Math.max(...finite), span = high - low || 1;
    const points = finite.map((v, i) => `${(i * 78 / (finite.length - 1) + 1).toFixed(1)},${(16 - (v - low) * 14 / span).toFixed(1)}`);
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.join(" ")); line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#0a6"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  return svg;
}

// Follow `url`'s events: `handlers[kind](data)`. A stream the server ended after an error is opened again by
// the browser (its retry), which runs the feed again: the page resumes once the box is back (`failure` says why meanwhile). A feed that
// ended for good (`ended` with no error before it) is closed here.
function follow(url, handlers, onState) {
  const source = new EventSource(url);
  let failed = false;
  for (const kind of Object.keys(handlers)) {
    source.addEventListener(kind, (event) => {
      if (failed) { failed = false; onState && onState(""); }
      handlers[kind](JSON.parse(event.data));
    });
  }
  source.addEventListener("failure", (event) => { failed = true; onState && onState(JSON.parse(event.data).message); });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CONNECTING && !failed) onState && onState("reconnecting to the tfrun ui server...");
  });
  source.addEventListener("open", () => { if (!failed) onState && onState(""); });
  source.addEventListener("ended", () => { if (!failed) source.close(); });
  return source;
}

// Which metrics are an evaluation's (tfrun/losses.py's EVALUATION_PREFIXES), and which is the training loss
// (its training_loss_name): the pages chart them as `tfrun metrics` tells them apart.
const EVALUATION = ["val", "test", "eval"];
function isEvaluation(name) { return EVALUATION.some((prefix) => name.startsWith(prefix)); }
function trainingLoss(names) {
  if (names.includes("loss")) return "loss";
  return names.find((name) => name.endsWith("loss") && !isEvaluation(name)) || null;
}

// An alert as `tfrun alerts` prints it: when, its rule, (its job), what it said, how each delivery went; its
// whole message folded under it.
function alertItem(alert, withJob) {
  const head = el("div", { class: "alert-head" }, el("span", { class: "when" }, alert.when), " ",
    el("b", { class: "rule" }, alert.rule), " ");
  if (withJob) {
    head.append(alert.job == null ? el("span", { class: "where" }, `${alert.box} (the box)`)
      : el("a", { class: "where", href: `/job/${encodeURIComponent(alert.box)}/${alert.job}` }, `${alert.box}:${alert.job}`), " ");
  }
  head.append(el("span", { class: "summary" }, alert.summary));
  const deliveries = el("ul", { class: "deliveries" });
  if (alert.undelivered) deliveries.append(el("li", { class: "dim" }, alert.undelivered));
  for (const delivery of alert.deliveries) {
    deliveries.append(el("li", { "data-state": delivery.state }, el("span", { class: "delivery-" + delivery.state }, delivery.state),
      ` ${delivery.target}`, el("span", { class: "dim" }, delivery.note), delivery.error));
  }
  const body = el("details", {}, el("summary", {}, "message"), el("pre", {}, alert.body));
  return el("li", { class: "alert", "data-rule": alert.rule, "data-box": alert.box, "data-job": alert.job ?? "" }, head, deliveries, body);
}

// The colours of a chart's lines, one a series in turn (uPlot's own default is one black for all).
const PALETTE = ["#06c", "#c60", "#0a6", "#a3c", "#c22", "#088", "#777", "#a80", "#36a", "#6a3"];

// A job's samples as its charts take them: the steps, and each metric's value at each; `thinned`: steps between
// these were left out for the first draw (client/ui/feeds.py), and a zoom asks for those it shows (`zoomInto`);
// `zooming`: the zoom whose samples are being asked for.
function newSamples() { return { steps: [], columns: new Map(), thinned: false, zooming: null }; }

// New samples of a job's metrics into `table` (`newSamples`), from a `points` event's columns: each
// metric's column grows by one value a step; undefined where the sample has none (the line runs on across it,
// as an evaluation's every few steps), null where it was not a number (a gap the chart shows). The same arrays
// each time, never copies, so a chart is handed them as they grow.
function addSamples(table, points) {
  table.thinned ||= Boolean(points.thinned);
  const index = table.steps.length, count = points.steps.length;
  table.steps.push(...points.steps);
  for (const [name, values] of Object.entries(points.columns)) {
    if (!table.columns.has(name)) table.columns.set(name, new Array(index).fill(undefined));
    const column = table.columns.get(name);
    for (let i = 0; i < count; i++) column.push(valueOf(values[i]));
  }
  for (const column of table.columns.values()) while (column.length < index + count) column.push(undefined);
}

// A sample's value as a chart takes it: none (null in JSON) is undefined, not a number ("nan") a gap (null).
function valueOf(value) { return value === null ? undefined : typeof value === "string" ? null : value; }

// A chart of `table`'s samples zoomed in (or out: back to all its steps); whether it is zoomed. Where the
// first draw was thinned, the samples of the steps now shown are asked of `url` (thinned again while more
// than the chart's width) and merged in, then `done()`: a zoom far enough in shows every real point.
function zoomInto(plot, table, url, done, failed) {
  const scale = plot.scales.x, steps = table.steps;
  if (scale.min == null || !steps.length) return false;
  const zoomed = scale.min > steps[0] || scale.max < steps[steps.length - 1];
  if (!zoomed || !table.thinned) return zoomed;
  const after = Math.floor(scale.min) - 1, upto = Math.ceil(scale.max), asked = `${after}:${upto}`;
  if (table.zooming === asked) return zoomed;
  table.zooming = asked;
  fetch(`${url}?after=${after}&upto=${upto}`).then((reply) => reply.json()).then((found) => {
    if (table.zooming !== asked) return;
    table.zooming = null;
    if (found.ok) { mergeSamples(table, found); done(); } else failed(found.message);
  });
  return zoomed;
}

// A zoom's samples into `table`, in step order, each step once.
function mergeSamples(table, points) {
  const detail = newSamples();
  addSamples(detail, points);
  const names = new Set([...table.columns.keys(), ...detail.columns.keys()]);
  const merged = { steps: [], columns: new Map([...names].map((name) => [name, []])) };
  let i = 0, j = 0;
  const take = (from, k) => {
    merged.steps.push(from.steps[k]);
    for (const name of names) merged.columns.get(name).push((from.columns.get(name) || [])[k]);
  };
  while (i < table.steps.length || j < detail.steps.length) {
    const mine = table.steps[i], theirs = detail.steps[j];
    if (j >= detail.steps.length || (i < table.steps.length && mine < theirs)) take(table, i++);
    else { take(detail, j++); if (mine === theirs) i++; }
  }
  table.steps = merged.steps;
  table.columns = merged.columns;
}
