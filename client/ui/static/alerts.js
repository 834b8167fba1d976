// The Alerts page: every box's alerts, newest first, each with its job and how its delivery went, as `tfrun
// alerts` says it (the `alerts` feed asks each box every few seconds: a retried delivery changes its state).
"use strict";

function showAlerts(listed) {
  document.getElementById("boxes").replaceChildren(...Object.entries(listed.boxes).map(([box, state]) =>
    el("span", { class: state.up ? "up" : "down", title: state.why || "" }, `${box}: ${state.up ? "up" : "down: " + state.why}`)));
  document.getElementById("alerts").replaceChildren(...listed.alerts.map((alert) => alertItem(alert, true)));
  document.getElementById("none").hidden = listed.alerts.length > 0;
}

const notice = document.getElementById("notice");
follow("/events/alerts", { alerts: showAlerts }, (message) => { notice.textContent = message; });
