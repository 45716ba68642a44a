// The demo's live page: renders the fleet state the demo pushes on WS /fleet (no framework,
// no build step). Every element a test reads carries a data- attribute.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const status = document.getElementById("status");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c);
    return node;
  }

  function clusterCard(c) {
    const card = el("article", {"class": "cluster", "data-cluster": c.name,
                                "data-machines": String(c.machines), "data-spot": String(c.spot)});
    card.append(el("h2", {}, c.name, el("span", {"class": "cost"}, "$" + c.cost_per_hour.toFixed(2) + "/h")));
    card.append(el("div", {"class": "figures"},
      el("span", {}, el("b", {}, String(c.machines)), " machines"),
      el("span", {}, el("b", {}, String(c.spot)), " spot"),
      el("span", {}, el("b", {}, String(c.reclaims_in_flight)), " reclaims in flight"),
      el("span", {}, el("b", {}, String(c.drains_in_flight)), " drains"),
      el("span", {"data-shortfalls": String(c.shortfalls)}, el("b", {}, String(c.shortfalls)), " short")));
    const table = el("table", {}, el("tr", {}, el("th", {}, "demand by profile"), el("th", {}, "prio"),
                                     el("th", {}, "cpu"), el("th", {}, "machines"), el("th", {}, "short")));
    for (const d of c.demand) {
      table.append(el("tr", {"class": "need"}, el("td", {}, d.profile), el("td", {}, String(d.priority)),
                      el("td", {}, d.cpu), el("td", {}, String(d.machines)),
                      el("td", {"class": d.short ? "short" : ""}, d.short || "-")));
    }
    card.append(table);
    const phases = el("div", {"class": "phases"});
    for (const [p, n] of Object.entries(c.phases)) phases.append(el("span", {"class": "phase", "data-phase": p}, p + " " + n));
    card.append(phases);
    const events = el("ul", {"class": "events"});
    for (const e of c.events.slice().reverse()) events.append(el("li", {}, e.kind + " " + e.detail));
    card.append(events);
    return card;
  }

  function render(state) {
    const clusters = document.getElementById("clusters");
    clusters.replaceChildren(...state.clusters.map(clusterCard));
    const moves = document.getElementById("moves");
    moves.replaceChildren(...state.moves.map((m) => el("li", {"class": "move", "data-from": m.from,
        "data-to": m.to, "data-why": m.why, "data-machine": m.machine},
      m.t.toFixed(1) + "s  " + m.instance_type + " " + m.node + "  " + m.from + " \u2192 " + m.to + "  ",
      el("span", {"class": "why-" + m.why}, m.why), m.spot ? el("span", {"class": "badge"}, "spot") : "")));
    document.getElementById("no-moves").hidden = state.moves.length > 0;
    status.textContent = "live \u00b7 " + state.t.toFixed(1) + "s";
    status.dataset.state = "live";
  }

  function connect() {
    const ws = new WebSocket(scheme + "//" + location.host + "/fleet?token=" + encodeURIComponent(token));
    ws.onmessage = (msg) => render(JSON.parse(msg.data));
    ws.onclose = () => { status.textContent = token ? "disconnected (the demo stopped?)"
                           : "no token: open the URL the demo printed"; status.dataset.state = "closed";
                         setTimeout(connect, 2000); };
  }
  connect();
})();
