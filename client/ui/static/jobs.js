// The jobs page: one page of every box's jobs, newest first, as the server's `jobs` events give it (it asks
// each box for that page through the protocol's paging); filters narrow what the page shows, kept in the URL.
"use strict";

const params = new URLSearchParams(location.search);
const page = Math.max(1, parseInt(params.get("page") || "1", 10) || 1);
const filters = { box: params.get("box") || "", state: params.get("state") || "", q: params.get("q") || "" };
let table = null;
let clock = 0; // the server's clock less this browser's: a running job's runtime counts on between events

function keepInUrl() {
  const shown = new URLSearchParams();
  if (page > 1) shown.set("page", page);
  for (const [key, value] of Object.entries(filters)) if (value) shown.set(key, value);
  history.replaceState(null, "", "/" + (shown.toString() ? "?" + shown : ""));
}

function pageUrl(number) {
  const shown = new URLSearchParams(location.search);
  shown.set("page", number);
  return "/?" + shown;
}

function passes(row) {
  if (filters.box && row.box !== filters.box) return false;
  if (filters.state && row.state !== filters.state) return false;
  const text = filters.q.trim().toLowerCase();
  return !text || String(row.id) === text || row.name.toLowerCase().includes(text);
}

function draw() {
  if (!table) return;
  const body = document.querySelector("#jobs tbody");
  const rows = [];
  for (const [box, state] of Object.entries(table.boxes)) {
    if (!state.up && (!filters.box || filters.box === box)) {
      rows.push(el("tr", { class: "down", "data-box": box }, el("td", {}, box),
        el("td", { colspan: 6 }, `down: ${state.why}`)));
    }
  }
  for (const row of table.rows.filter(passes)) {
    const link = el("a", { href: `/job/${encodeURIComponent(row.box)}/${row.id}` }, row.id);
    rows.push(el("tr", { "data-box": row.box, "data-id": row.id },
      el("td", {}, row.box), el("td", { class: "num" }, link), el("td", {}, row.name),
      el("td", { class: "state-" + row.state }, row.state), el("td", { class: "num" }, runtime(row, Date.now() / 1000 + clock)),
      el("td", { class: "num loss" }, loss(row.loss)), el("td", {}, sparkline(row.losses))));
  }
  body.replaceChildren(...rows);
  const boxes = document.getElementById("boxes");
  boxes.replaceChildren(...Object.entries(table.boxes).map(([box, state]) =>
    el("span", { class: state.up ? "up" : "down", title: state.why || "" }, `${box}: ${state.up ? "up" : "down"}`)));
  document.getElementById("older").hidden = !table.more;
}

async function start() {
  const view = await (await fetch("/api/view")).json();
  const select = document.getElementById("box");
  for (const box of view.boxes) select.append(el("option", { value: box }, box));
  for (const [key, value] of Object.entries(filters)) document.getElementById(key).value = value;
  document.getElementById("filters").addEventListener("input", (event) => {
    filters[event.target.name] = event.target.value;
    keepInUrl();
    draw();
  });
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  document.getElementById("newer").hidden = page === 1;
  document.getElementById("newer").href = pageUrl(page - 1);
  document.getElementById("older").href = pageUrl(page + 1);
  document.getElementById("pageno").textContent = `page ${page}`;
  const notice = document.getElementById("notice");
  follow(`/events/jobs?page=${page}`, { jobs: (data) => { table = data; clock = data.now - Date.now() / 1000; draw(); } },
    (message) => { notice.textContent = message; });
  setInterval(draw, 1000);
}

start();
