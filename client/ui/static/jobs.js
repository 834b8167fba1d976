// The jobs page: one page of every box's jobs, newest first, as the server's `jobs` events give it (it asks
// each box for that page, narrowed by the filters, through the protocol's paging); the filters and each box's
// cursor are kept in the URL, so a page can be bookmarked, and Back is the page before.
"use strict";

const params = new URLSearchParams(location.search);
let page = Math.max(1, parseInt(params.get("page") || "1", 10) || 1); // its number, shown: where it starts is `befores`
let befores = params.getAll("before"); // each box's cursor, BOX:ID: this page holds that box's jobs below ID
const filters = { box: params.get("box") || "", state: params.get("state") || "", q: params.get("q") || "" };
let table = null;
let clock = 0; // the server's clock less this browser's: a running job's runtime counts on between events
let source = null; // the stream of the page shown
let typing = 0; // the text filter is asked for once typing pauses, not at each key

// The URL of page `number` of the jobs the filters keep, starting on each box below `cursors` ({box: id}).
function pageUrl(cursors, number) {
  const shown = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) if (value) shown.set(key, value);
  if (number > 1) {
    shown.set("page", number);
    for (const [box, id] of Object.entries(cursors)) shown.append("before", `${box}:${id}`);
  }
  return "/" + (shown.toString() ? "?" + shown : "");
}

// Follow the page the filters and cursors name: the boxes narrow their lists themselves (the server asks each
// for its newest jobs of that state and text below its cursor), so a filter is a new page, from the first.
function openPage() {
  if (source) source.close();
  const shown = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) if (value) shown.set(key, value);
  for (const cursor of befores) shown.append("before", cursor);
  const notice = document.getElementById("notice");
  source = follow(`/events/jobs?${shown}`, { jobs: (data) => { table = data; clock = data.now - Date.now() / 1000; draw(); } },
    (message) => { notice.textContent = message; });
}

function filtered(event) {
  filters[event.target.name] = event.target.value;
  page = 1;
  befores = [];
  history.replaceState(null, "", pageUrl({}, 1));
  showPager();
  clearTimeout(typing);
  typing = setTimeout(() => { table = null; document.querySelector("#jobs tbody").replaceChildren(); openPage(); },
    event.target.name === "q" ? 300 : 0);
}

function showPager() {
  const newest = document.getElementById("newer");
  newest.hidden = page === 1;
  newest.textContent = "newest";
  newest.href = pageUrl({}, 1);
  document.getElementById("pageno").textContent = `page ${page}`;
  document.getElementById("older").hidden = !table || !table.more;
  if (table) document.getElementById("older").href = pageUrl(table.next, page + 1);
}

function draw() {
  if (!table) return;
  const body = document.querySelector("#jobs tbody");
  const rows = [];
  for (const [box, state] of Object.entries(table.boxes)) {
    if (!state.up && (!filters.box || filters.box === box)) {
      rows.push(el("tr", { class: "down", "data-box": box }, el("td", {}), el("td", {}, box),
        el("td", { colspan: 7 }, `down: ${state.why}`)));
    }
  }
  for (const row of table.rows) {
    const link = el("a", { href: `/job/${encodeURIComponent(row.box)}/${row.id}` }, row.id);
    const ref = `${row.box}:${row.id}`;
    const tick = el("input", { type: "checkbox", class: "pick", "data-ref": ref, title: "compare this job" });
    tick.checked = picked.has(ref);
    rows.push(el("tr", { "data-box": row.box, "data-id": row.id },
      el("td", {}, tick), el("td", {}, row.box), el("td", { class: "num" }, link), el("td", {}, row.name),
      el("td", { class: "state-" + row.state }, row.state), el("td", { class: "num" }, runtime(row, Date.now() / 1000 + clock)),
      el("td", { class: "num loss" }, loss(row.loss)), el("td", {}, sparkline(row.losses)), arrayCell(row)));
  }
  body.replaceChildren(...rows);
  const boxes = document.getElementById("boxes");
  boxes.replaceChildren(...Object.entries(table.boxes).map(([box, state]) =>
    el("span", { class: state.up ? "up" : "down", title: state.why || "" }, `${box}: ${state.up ? "up" : "down"}`)));
  showPager();
}

// The jobs ticked for Compare, kept for this tab across pages of the table (`box:id`, in the order ticked).
const picked = new Set(JSON.parse(sessionStorage.getItem("tfrun-ui-picked") || "[]"));

function pick(ref, on) {
  if (on) picked.add(ref); else picked.delete(ref);
  sessionStorage.setItem("tfrun-ui-picked", JSON.stringify([...picked]));
  showPicked();
}

function showPicked() {
  const button = document.getElementById("compare");
  button.disabled = !picked.size;
  button.textContent = picked.size ? `Compare the ${picked.size} job${picked.size > 1 ? "s" : ""} ticked` : "Compare the jobs ticked";
  document.getElementById("unpick").hidden = !picked.size;
}

// A task of an array: its array and index, and the array's tasks compared in one click.
function arrayCell(row) {
  if (row.array_id == null) return el("td", {});
  const link = el("a", { class: "compare-array", href: `/compare?array=${encodeURIComponent(row.box)}:${row.array_id}` }, "compare");
  return el("td", {}, `${row.array_id}[${row.array_index}] `, link);
}

async function start() {
  const view = await (await fetch("/api/view")).json();
  const select = document.getElementById("box");
  for (const box of view.boxes) select.append(el("option", { value: box }, box));
  for (const [key, value] of Object.entries(filters)) document.getElementById(key).value = value;
  document.getElementById("filters").addEventListener("input", filtered);
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  document.querySelector("#jobs tbody").addEventListener("change", (event) => {
    if (event.target.classList.contains("pick")) pick(event.target.dataset.ref, event.target.checked);
  });
  document.getElementById("compare").addEventListener("click", () =>
    location.assign("/compare?jobs=" + [...picked].map((ref) => encodeURIComponent(ref).replace(/%3A/g, ":")).join(",")));
  document.getElementById("unpick").addEventListener("click", () => { for (const ref of [...picked]) pick(ref, false); draw(); });
  showPicked();
  showPager();
  openPage();
  setInterval(draw, 1000);
}

start();
