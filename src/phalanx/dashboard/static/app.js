// Phalanx dashboard: renders the view the server embeds in the page, then applies the
// sections the server pushes over server-sent events (/events). Read-only: no form posts.
"use strict";

const state = JSON.parse(document.getElementById("initial").textContent);
const app = document.getElementById("app");
const status = document.getElementById("status");
let filter = { q: "", cq: "" };
let source = null;
let selectedGang = "";
// The usage view is fetched (/api/usage), not pushed: the store is read at most every 30 s.
let usage = null;
const usageParams = { window: "24h", by: "localqueue", resource: "nvidia.com/gpu" };
let usageTimer = null;
const COLORS = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#9e9d24",
  "#4e342e", "#ad1457", "#37474f"];
// For the browser test and the curious: when each update arrived (ms since navigation).
window.phalanxUpdates = [];

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function age(iso) {
  const t = Date.parse(iso);
  if (!iso || isNaN(t)) return "";
  let s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 120) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + "m" + (s % 60) + "s";
  return Math.floor(m / 60) + "h" + (m % 60) + "m";
}

function section(id, title, body) {
  return `<section id="${id}"><h2>${esc(title)}</h2>${body}</section>`;
}

function counts() {
  const c = state.counts;
  const card = (k, label) => `<div class="card" data-count="${k}"><b>${c[k]}</b>${label}</div>`;
  return `<div class="cards">${card("pending", "pending")}${card("quota_reserved",
    "quota reserved")}${card("admitted", "admitted")}${card("finished", "finished")}</div>`;
}

function quotaRows(node, depth) {
  const pad = "&nbsp;".repeat(depth * 4);
  const cls = node.kind === "Cohort" ? "tree-cohort" : "";
  let out = "";
  const rows = node.rows.length ? node.rows : [{ flavor: "", resource: "" }];
  rows.forEach((r, i) => {
    const bar = r.resource ? `<span class="bar${r.percent > 100 ? " over" : ""}">` +
      `<i style="width:${Math.min(100, r.percent)}%"></i></span> ${r.percent}%` : "";
    out += `<tr class="${cls}"><td>${i === 0 ? pad + esc(node.kind === "Cohort" ? "▾ " : "")
      + esc(node.name) : ""}</td><td>${esc(r.flavor)}</td><td>${esc(r.resource)}</td>` +
      `<td class="num">${esc(r.nominal)}</td><td class="num">${esc(r.usage)}</td>` +
      `<td>${bar}</td><td class="num">${esc(r.borrowed)}</td>` +
      `<td class="num">${esc(r.borrowingLimit)}</td><td class="num">${esc(r.lendable)}</td>` +
      `<td class="num">${esc(r.lendingLimit)}</td></tr>`;
  });
  for (const child of node.children || []) out += quotaRows(child, depth + 1);
  return out;
}

function cohorts() {
  if (state.cohorts === null) return `<p class="muted">Not shown: you may not list ClusterQueues.</p>`;
  if (!state.cohorts.length) return `<p class="muted">No ClusterQueues.</p>`;
  return `<table><tr><th>cohort / ClusterQueue</th><th>flavor</th><th>resource</th>` +
    `<th>nominal</th><th>usage</th><th></th><th>borrowed</th><th>borrowing limit</th>` +
    `<th>unused, lendable</th><th>lending limit</th></tr>` +
    state.cohorts.map((n) => quotaRows(n, 0)).join("") + `</table>`;
}

function clusterQueues() {
  if (state.clusterQueues === null) return `<p class="muted">Not shown: you may not list ClusterQueues.</p>`;
  return `<table><tr><th>ClusterQueue</th><th>cohort</th><th>pending</th><th>admitted</th>` +
    `<th>weighted share</th><th>state</th></tr>` + state.clusterQueues.map((q) =>
      `<tr data-cq="${esc(q.name)}"><td>${esc(q.name)}</td><td>${esc(q.cohort)}</td>` +
      `<td class="num" data-field="pending">${q.pending}</td>` +
      `<td class="num" data-field="admitted">${q.admitted}</td>` +
      `<td class="num">${q.weightedShare ?? ""}</td>` +
      `<td>${q.stop ? `<span class="stopped">stopped (${esc(q.stop)})</span>` :
        q.active ? "active" : `<span class="stopped">inactive</span> ${esc(q.why)}`}</td></tr>`
    ).join("") + `</table>`;
}

function localQueues() {
  if (!state.localQueues.length) return `<p class="muted">No LocalQueues you may read.</p>`;
  return `<table><tr><th>namespace</th><th>LocalQueue</th><th>ClusterQueue</th>` +
    `<th>pending</th><th>admitted</th><th>decayed usage</th><th>state</th></tr>` +
    state.localQueues.map((q) =>
      `<tr data-lq="${esc(q.namespace + "/" + q.name)}"><td>${esc(q.namespace)}</td>` +
      `<td>${esc(q.name)}</td><td>${esc(q.clusterQueue)}</td>` +
      `<td class="num" data-field="pending">${q.pending}</td>` +
      `<td class="num" data-field="admitted">${q.admitted}</td>` +
      `<td>${esc(q.consumed)}</td>` +
      `<td>${q.stop ? `<span class="stopped">stopped (${esc(q.stop)})</span>` : "active"}</td></tr>`
    ).join("") + `</table>`;
}

function pending() {
  const p = state.pending;
  const cqs = (state.clusterQueues || []).map((q) => q.name);
  const options = [`<option value="">all ClusterQueues</option>`].concat(cqs.map((n) =>
    `<option${n === filter.cq ? " selected" : ""}>${esc(n)}</option>`)).join("");
  const rows = p.rows.map((w) =>
    `<tr data-wl="${esc(w.namespace + "/" + w.name)}"><td class="num">${w.position ?? "-"}</td>` +
    `<td><a class="wl" href="#workload/${encodeURIComponent(w.namespace)}/` +
    `${encodeURIComponent(w.name)}">${esc(w.namespace)}/${esc(w.name)}</a></td>` +
    `<td>${esc(w.localQueue)}</td><td>${esc(w.clusterQueue)}</td><td class="num">${w.priority}</td>` +
    `<td class="num" data-created="${esc(w.created)}">${age(w.created)}</td>` +
    `<td class="reason">${esc(w.reason)}</td></tr>`).join("");
  const more = p.matched > p.rows.length ?
    `<p class="muted">Showing ${p.rows.length} of ${p.matched}; narrow the search to see others.</p>` : "";
  return `<div class="filters"><input id="search" type="search" placeholder="search ` +
    `namespace/name, queue or reason" value="${esc(filter.q)}"><select id="cq">${options}` +
    `</select></div><p id="matched">${p.matched} pending</p>` +
    (state.notice ? `<p class="muted">${esc(state.notice)}</p>` : "") +
    `<table><tr><th>position</th><th>workload</th><th>LocalQueue</th><th>ClusterQueue</th>` +
    `<th>priority</th><th>waiting</th><th>why</th></tr>${rows}</table>${more}`;
}

function nodeCell(n, resource) {
  const pct = n.capacity ? Math.round(100 * n.used / n.capacity) : 0;
  const cls = ["node", n.used && n.used >= n.capacity ? "full" : n.used ? "partial" : "",
    n.gangs.length ? "gang" : "", selectedGang && n.gangs.includes(selectedGang) ? "selected" : ""];
  return `<div class="${cls.join(" ")}" data-node="${esc(n.name)}" data-used="${n.used}" ` +
    `data-gangs="${esc(n.gangs.join(" "))}" title="${esc(n.name)}: ${n.used}/${n.capacity} ` +
    `${esc(resource)}${n.gangs.length ? "\n" + esc(n.gangs.join("\n")) : ""}">` +
    `${esc(n.name)}<br>${n.used}/${n.capacity}<div class="fill" style="width:${pct}%"></div></div>`;
}

function group(g, resource, depth) {
  const head = `${esc(g.name)} <span class="muted">${g.used}/${g.capacity} used, free ` +
    `${g.free}${g.fragments.length ? " as " + g.fragments.join("+") : ""}</span>`;
  if (g.nodes) {
    return `<div class="rack" data-group="${esc(g.name)}"><h4>${head}</h4><div class="nodes">` +
      g.nodes.map((n) => nodeCell(n, resource)).join("") + `</div></div>`;
  }
  return `<div class="block" data-group="${esc(g.name)}"><h3>${head}</h3><div class="racks">` +
    g.groups.map((c) => group(c, resource, depth + 1)).join("") + `</div></div>`;
}

function topology() {
  if (state.topology === null) return `<p class="muted">Not shown: you may not list ClusterQueues.</p>`;
  if (!state.topology.length) return `<p class="muted">No Topology objects.</p>`;
  const gangs = new Set();
  state.topology.forEach((t) => walkNodes(t.groups, (n) => n.gangs.forEach((g) => gangs.add(g))));
  const pick = [`<option value="">highlight a gang…</option>`].concat([...gangs].sort().map((g) =>
    `<option${g === selectedGang ? " selected" : ""}>${esc(g)}</option>`)).join("");
  return `<div class="filters"><select id="gang">${pick}</select></div>` +
    state.topology.map((t) => `<h3>${esc(t.name)} <span class="muted">` +
      `${esc(t.levels.join(" > "))}, ${esc(t.resource)}</span></h3><div class="blocks">` +
      t.groups.map((g) => group(g, t.resource, 0)).join("") + `</div>`).join("");
}

// Hours and decayed usage span 0.0003 to 30,000: two significant digits below 1, two
// decimals up to 100, whole numbers beyond.
function num(v) {
  const a = Math.abs(v);
  if (!a) return "0";
  return String(a >= 100 ? Math.round(v) : a >= 1 ? +v.toFixed(2) : +v.toPrecision(2));
}

function usageControls() {
  const pick = (id, values, current, label) => `<label>${label} <select id="${id}">` +
    values.map(([v, text]) => `<option value="${esc(v)}"${v === current ? " selected" : ""}>` +
      `${esc(text)}</option>`).join("") + `</select></label>`;
  const resources = (usage && usage.resources && usage.resources.length) ? usage.resources :
    [usageParams.resource];
  return `<div class="filters">` +
    pick("usage-window", [["24h", "last 24 hours"], ["7d", "last 7 days"],
      ["30d", "last 30 days"]], usageParams.window, "window") +
    pick("usage-by", [["localqueue", "LocalQueue"], ["namespace", "namespace"],
      ["clusterqueue", "ClusterQueue"]], usageParams.by, "per") +
    pick("usage-resource", resources.map((r) => [r, r]), usageParams.resource, "resource") +
    `<button id="usage-refresh" type="button">refresh</button></div>`;
}

function usageChart(u) {
  const n = u.starts.length;
  if (!n || !u.series.length) return "";
  const W = 900, H = 220, left = 56, bottom = 22, top = 8;
  const sums = u.starts.map((_, i) => u.series.reduce((a, s) => a + s.hours[i], 0));
  const max = Math.max(...sums) || 1;
  const band = (W - left) / n, bar = Math.max(1, band * 0.8);
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  let out = `<svg class="chart" id="usage-chart" viewBox="0 0 ${W} ${H}" role="img" ` +
    `aria-label="${esc(u.resource)} hours per ${esc(u.width)}">`;
  for (const f of [0, 0.5, 1]) {
    out += `<line x1="${left}" x2="${W}" y1="${y(max * f)}" y2="${y(max * f)}" class="grid"/>` +
      `<text x="${left - 4}" y="${y(max * f) + 4}" text-anchor="end">${num(max * f)}</text>`;
  }
  u.starts.forEach((start, i) => {
    let base = 0;
    const x = left + i * band + (band - bar) / 2;
    u.series.forEach((s, k) => {
      const v = s.hours[i];
      if (v > 0) {
        out += `<rect x="${x.toFixed(1)}" width="${bar.toFixed(1)}" y="${y(base + v).toFixed(1)}" ` +
          `height="${(y(base) - y(base + v)).toFixed(1)}" fill="${COLORS[k % COLORS.length]}">` +
          `<title>${esc(s.group)} ${esc(start)}: ${num(v)}</title></rect>`;
      }
      base += v;
    });
    const every = Math.ceil(n / 8);
    if (i % every === 0) {
      const d = new Date(start);
      const label = u.width === "hour" ? d.toISOString().slice(11, 16) : d.toISOString().slice(5, 10);
      out += `<text x="${(x + bar / 2).toFixed(1)}" y="${H - 6}" text-anchor="middle">${label}</text>`;
    }
  });
  return out + `</svg>`;
}

function usageSection() {
  const head = usageControls();
  if (!usage) return head + `<p class="muted">loading…</p>`;
  if (usage.error) return head + `<p class="stopped">${esc(usage.error)}</p>`;
  if (usage.problem) return head + `<p class="muted" id="usage-problem">${esc(usage.problem)}</p>`;
  if (usage.refused) return head + `<p class="muted">${esc(usage.refused)}</p>`;
  const unit = usage.unit ? ` (${usage.unit})` : "";
  const legend = usage.series.map((s, k) => `<tr data-usage-group="${esc(s.group)}" ` +
    `data-total="${s.total}"><td><span class="swatch" style="background:` +
    `${COLORS[k % COLORS.length]}"></span>${esc(s.group)}</td>` +
    `<td class="num">${num(s.total)}</td></tr>`).join("");
  return head + `<p class="muted">${esc(usage.resource)} hours${esc(unit)} per ${esc(usage.width)}` +
    ` (UTC), from the usage history store, read ${esc(usage.until)}.</p>` +
    (usage.series.length ? usageChart(usage) + `<table><tr><th>${esc(usage.by)}</th>` +
      `<th>${esc(usage.resource)} hours in the window</th></tr>${legend}</table>` :
      `<p class="muted">No usage in this window you may read.</p>`);
}

function fairShare() {
  const resource = usageParams.resource;
  if (!state.fairShare || !state.fairShare.length) {
    return `<p class="muted">No ClusterQueue with admission fair sharing ` +
      `(admissionScope.admissionMode: UsageBasedAdmissionFairSharing) has a LocalQueue you may read.</p>`;
  }
  return `<p class="muted">Decayed ${esc(resource)} usage of each LocalQueue (its status, as the ` +
    `operator samples it) beside its fair share by weight.</p>` + state.fairShare.map((cq) => {
    const rows = cq.queues.map((q) => {
      const used = q.consumed[resource] ?? 0;
      const share = q.share ? (q.share[resource] ?? 0) : null;
      const bar = share === null ? "" : `<svg class="share" viewBox="0 0 200 14" width="200" height="14">` +
        `<rect x="0" y="2" width="${(200 * Math.min(1, share)).toFixed(1)}" height="10" ` +
        `class="${share > q.fair ? "over" : "under"}"/><line x1="${(200 * q.fair).toFixed(1)}" ` +
        `x2="${(200 * q.fair).toFixed(1)}" y1="0" y2="14" class="fair"/></svg>`;
      return `<tr data-fair="${esc(q.namespace + "/" + q.name)}"><td>${esc(q.namespace)}/` +
        `${esc(q.name)}</td><td class="num">${q.weight}</td>` +
        `<td class="num">${(100 * q.fair).toFixed(1)}%</td><td class="num">${num(used)}</td>` +
        `<td class="num">${share === null ? "-" : (100 * share).toFixed(1) + "%"}</td><td>${bar}</td></tr>`;
    }).join("");
    const total = cq.total ? ` <span class="muted">decayed total ${num(cq.total[resource] ?? 0)}</span>` : "";
    return `<h3>${esc(cq.clusterQueue)}${total}</h3><table><tr><th>LocalQueue</th>` +
      `<th>weight</th><th>fair share</th><th>decayed usage</th><th>share of usage</th>` +
      `<th></th></tr>${rows}</table>`;
  }).join("");
}

async function loadUsage() {
  const params = new URLSearchParams(usageParams);
  const response = await fetch("/api/usage?" + params.toString(), { credentials: "same-origin" });
  usage = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (usage.resource) usageParams.resource = usage.resource;
  if (tab() === "usage") renderSections(["usage", "fairShare"]);
}

function walkNodes(groups, fn) {
  for (const g of groups) {
    if (g.nodes) g.nodes.forEach(fn); else walkNodes(g.groups, fn);
  }
}

const RENDERERS = {
  counts: ["counts", "Workloads", counts],
  cohorts: ["cohorts", "Cohorts and quotas", cohorts],
  clusterQueues: ["clusterqueues", "ClusterQueues", clusterQueues],
  localQueues: ["localqueues", "LocalQueues", localQueues],
  pending: ["pending", "Pending workloads", pending],
  topology: ["topology", "Topology", topology],
  usage: ["usage", "Usage over time", usageSection],
  fairShare: ["fairshare", "Admission fair sharing: decayed usage and fair share", fairShare],
};
const TABS = {
  overview: ["counts", "cohorts", "clusterQueues", "localQueues"],
  pending: ["counts", "pending"],
  topology: ["counts", "topology"],
  usage: ["usage", "fairShare"],
};

function tab() {
  const h = location.hash.replace(/^#/, "");
  return h.startsWith("workload/") ? "workload" : (TABS[h] ? h : "overview");
}

function renderAll() {
  const t = tab();
  clearInterval(usageTimer);
  if (t === "usage") {
    loadUsage();
    usageTimer = setInterval(loadUsage, 30000);
  }
  if (t === "workload") return renderWorkload();
  app.innerHTML = TABS[t].map((k) => {
    const [id, title, fn] = RENDERERS[k];
    return section(id, title, fn());
  }).join("");
  bind();
}

function renderSections(keys) {
  const t = tab();
  if (t === "workload") return;
  const focused = document.activeElement && document.activeElement.id;
  for (const k of keys) {
    if (!TABS[t].includes(k)) continue;
    const [id, title, fn] = RENDERERS[k];
    const el = document.getElementById(id);
    if (el) el.outerHTML = section(id, title, fn());
  }
  bind();
  if (focused === "search") {
    const s = document.getElementById("search");
    s.focus(); s.setSelectionRange(s.value.length, s.value.length);
  }
}

let searchTimer = null;
function bind() {
  const search = document.getElementById("search");
  if (search) search.oninput = () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { filter.q = search.value; connect(); }, 250);
  };
  const cq = document.getElementById("cq");
  if (cq) cq.onchange = () => { filter.cq = cq.value; connect(); };
  const gang = document.getElementById("gang");
  if (gang) gang.onchange = () => { selectedGang = gang.value; renderSections(["topology"]); };
  for (const key of ["window", "by", "resource"]) {
    const el = document.getElementById("usage-" + key);
    if (el) el.onchange = () => { usageParams[key] = el.value; loadUsage(); };
  }
  const refresh = document.getElementById("usage-refresh");
  if (refresh) refresh.onclick = loadUsage;
}

async function renderWorkload(quiet) {
  const [, ns, name] = location.hash.replace(/^#/, "").split("/");
  if (!quiet) app.innerHTML = section("workload", "Workload", `<p class="muted">loading…</p>`);
  const response = await fetch(`/api/workloads/${ns}/${name}`, { credentials: "same-origin" });
  const w = await response.json();
  if (!response.ok) {
    app.innerHTML = section("workload", "Workload", `<p>${esc(w.error)}</p>`);
    return;
  }
  const row = (k, v) => `<tr><th>${k}</th><td>${v}</td></tr>`;
  app.innerHTML = section("workload", `Workload ${w.namespace}/${w.name}`,
    `<table>${row("state", `<span id="wl-state">${esc(w.state)}</span>`)}` +
    row("queue", `${esc(w.localQueue)} → ${esc(w.clusterQueue)}`) +
    row("position", w.position ?? "-") + row("priority", w.priority) + row("owner", esc(w.owner)) +
    row("pod sets", w.podSets.map((p) => `${esc(p.name)} x${p.count}`).join(", ")) +
    row("admitted to", esc(w.admission) || "-") +
    row("why", `<span id="wl-reason">${esc(w.reason) || "-"}</span>`) + `</table>` +
    `<h3>Timeline</h3><ul class="timeline">` + w.timeline.map((e) =>
      `<li><b>${esc(e.event)}</b> <span class="muted">${esc(e.time)}</span> ${esc(e.detail)}</li>`
    ).join("") + `</ul><p class="muted">Kubernetes keeps the last transition of each ` +
    `condition; earlier ones are not shown.</p><p><a href="#pending">back to pending</a></p>`);
}

function connect() {
  if (source) source.close();
  const params = new URLSearchParams();
  if (filter.q) params.set("q", filter.q);
  if (filter.cq) params.set("cq", filter.cq);
  source = new EventSource("/events?" + params.toString());
  source.addEventListener("view", (event) => {
    const changed = JSON.parse(event.data);
    Object.assign(state, changed);
    window.phalanxUpdates.push(performance.now());
    status.textContent = "live, updated " + new Date().toLocaleTimeString();
    status.className = "live";
    const keys = Object.keys(changed).filter((k) => k in RENDERERS);
    if ("notice" in changed && !keys.includes("pending")) keys.push("pending");
    renderSections(keys);
    if (tab() === "workload") renderWorkload(true);
  });
  source.onerror = () => { status.textContent = "reconnecting"; status.className = "down"; };
}

window.addEventListener("hashchange", renderAll);
setInterval(() => {
  document.querySelectorAll("[data-created]").forEach((el) => {
    el.textContent = age(el.dataset.created);
  });
}, 1000);
renderAll();
performance.mark("phalanx-first-render");
connect();
