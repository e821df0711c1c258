// Ember dashboard: polls api/job once a second and renders it. No dependencies; every
// value is put in the page with textContent (never as HTML).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 1000;
const BOX_W = 200, BOX_H = 80, COL_W = 232, ROW_H = 100, PAD = 20;
let graphKey = null;

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function num(n) {
  if (n === null || n === undefined) return "—";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + " G";
  if (a >= 1e6) return (n / 1e6).toFixed(2) + " M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + " k";
  return Number.isInteger(n) || a >= 100 ? String(Math.round(n)) : n.toFixed(1);
}
function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function stamp(ms) { return ms === null || ms === undefined ? "—" : new Date(ms).toISOString().replace("T", " ").replace("Z", ""); }
function secs(s) { return s === null || s === undefined ? "—" : s.toFixed(1) + " s"; }
function pct(x) { return x === null || x === undefined ? "—" : (100 * x).toFixed(0) + " %"; }
function text(id, value) { const n = document.getElementById(id); if (n) n.textContent = value; }

function layout(steps) {
  const depth = {}, rows = {}, pos = {};
  for (const s of steps) depth[s.name] = s.inputs.length ? Math.max(...s.inputs.map(i => depth[i] ?? 0)) + 1 : 0;
  for (const s of steps) {
    const d = depth[s.name];
    rows[d] = (rows[d] || 0);
    pos[s.name] = { x: PAD + d * COL_W, y: PAD + rows[d] * ROW_H };
    rows[d] += 1;
  }
  const width = PAD * 2 + (Math.max(0, ...Object.values(depth)) * COL_W) + BOX_W;
  const height = PAD * 2 + (Math.max(1, ...Object.values(rows)) - 1) * ROW_H + BOX_H;
  return { pos, width, height };
}

function drawGraph(steps) {
  const svg = document.getElementById("graph");
  svg.replaceChildren();
  const { pos, width, height } = layout(steps);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const defs = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" });
  marker.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#94a3b8" }));
  defs.appendChild(marker);
  svg.appendChild(defs);
  for (const s of steps) for (const i of s.inputs) {
    const a = pos[i], b = pos[s.name];
    const x1 = a.x + BOX_W, y1 = a.y + BOX_H / 2, x2 = b.x, y2 = b.y + BOX_H / 2, mx = (x1 + x2) / 2;
    svg.appendChild(el("path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
  }
  for (const s of steps) {
    const p = pos[s.name];
    const g = el("g", { class: `step ${s.role}${s.stateful ? " stateful" : ""}`, "data-step": s.name, transform: `translate(${p.x},${p.y})` });
    g.appendChild(el("title", {}, `${s.name}: ${s.describe}`));
    g.appendChild(el("rect", { width: BOX_W, height: BOX_H, rx: 6 }));
    g.appendChild(el("text", { x: 10, y: 18, class: "name" }, s.name.length > 30 ? s.name.slice(0, 29) + "…" : s.name));
    const kind = s.describe.length > 36 ? s.describe.slice(0, 35) + "…" : s.describe;
    g.appendChild(el("text", { x: 10, y: 34, class: "kind" }, kind));
    g.appendChild(el("text", { x: 10, y: 52, class: "rates" }, "—"));
    g.appendChild(el("text", { x: 10, y: 69, class: "state" }, s.stateful ? "state —" : ""));
    svg.appendChild(g);
  }
}

function updateGraph(snap) {
  for (const g of document.querySelectorAll("#graph g.step")) {
    const name = g.getAttribute("data-step");
    const st = snap.steps[name];
    if (!st) continue;
    const parts = [];
    if (st.records_in_per_s !== null) parts.push(`in ${num(st.records_in_per_s)}/s`);
    if (st.records_out_per_s !== null) parts.push(`out ${num(st.records_out_per_s)}/s`);
    const total = st.records_out_total ?? st.records_in_total;
    if (total !== null && total !== undefined) parts.push(`Σ ${num(total)}`);
    g.querySelector(".rates").textContent = parts.length ? parts.join(" · ") : "—";
    g.setAttribute("data-records", total ?? "");
    if (st.state) {
      g.querySelector(".state").textContent = `state ${num(st.state.rows)} rows · ${bytes(st.state.bytes)}`;
    }
  }
}

function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    return tr;
  }));
}

function bars(id, values, labels) {
  const svg = document.getElementById(id);
  const w = svg.clientWidth || 500, h = svg.clientHeight || 120;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.replaceChildren();
  const max = Math.max(1, ...values);
  const bw = w / Math.max(1, values.length);
  values.forEach((v, i) => {
    const bh = (h - 22) * v / max;
    const r = el("rect", { class: "bar", x: i * bw + 1, y: h - 14 - bh, width: Math.max(1, bw - 2), height: bh });
    r.appendChild(el("title", {}, labels[i]));
    svg.appendChild(r);
  });
  svg.appendChild(el("text", { x: 4, y: 12 }, `max ${num(max)}`));
}

function render(snap) {
  text("job-name", snap.job);
  const status = document.getElementById("status");
  status.textContent = snap.status;
  status.className = "badge " + (snap.status === "running" ? "running" : snap.status === "failed" ? "failed" : "");
  document.title = `Ember · ${snap.job} · ${snap.status}`;
  const spark = document.getElementById("spark-ui");
  if (snap.spark_ui) { spark.href = snap.spark_ui; spark.textContent = "Spark UI"; }
  else { spark.removeAttribute("href"); spark.textContent = "Spark UI off (spark.ui.enabled)"; }
  const key = JSON.stringify(snap.graph.map(s => [s.name, s.inputs]));
  if (key !== graphKey) { drawGraph(snap.graph); graphKey = key; }
  updateGraph(snap);
  text("events-total", snap.events_total.toLocaleString("en-US"));
  text("events-rate", num(snap.events_per_s));
  text("watermark", snap.watermark_ms ? stamp(snap.watermark_ms).slice(11) : "—");
  text("watermark-lag", snap.watermark_lag_s !== null ? `${secs(snap.watermark_lag_s)} behind wall clock` : "no event time");
  text("batch-count", String(snap.batches.count));
  const d = snap.batches.duration_ms;
  text("batch-pcts", d.p50 !== null ? `p50 ${d.p50} ms · p90 ${d.p90} · p99 ${d.p99} · max ${d.max} ms` : "");
  text("late-total", snap.late_records_total.toLocaleString("en-US"));
  text("checkpoint-size", bytes(snap.checkpoints.size_bytes));
  fillTable("sources", Object.entries(snap.sources).map(([name, s]) => [
    name, num(s.records_total), num(s.records_per_s), num(s.lag_records), secs(s.lag_seconds),
    pct(s.saturation), s.watermark_ms ? stamp(s.watermark_ms).slice(11) : "—", secs(s.watermark_lag_s)]));
  const recent = snap.batches.recent;
  bars("batch-chart", recent.map(b => b.duration_ms), recent.map(b => `batch ${b.batch_id}: ${b.duration_ms} ms, ${b.events} events`));
  const hist = snap.batches.histogram;
  bars("batch-hist", hist.counts, hist.counts.map((c, i) => `≤ ${hist.bounds_s[i] ?? "∞"} s: ${c} batches`));
  const measured = Object.entries(snap.latency || {});
  document.getElementById("latency-panel").hidden = measured.length === 0;
  if (measured.length) {
    const [sink, lat] = measured[0];
    text("latency-summary", `${sink} (arrival − ${lat.field}), ${lat.samples.toLocaleString("en-US")} samples: ` +
      (lat.ms.p50 !== null ? `p50 ${lat.ms.p50} ms · p90 ${lat.ms.p90} · p99 ${lat.ms.p99} · max ${lat.ms.max} ms` : "none yet"));
    const h = lat.histogram;
    bars("latency-hist", h.counts, h.counts.map((c, i) => `≤ ${h.bounds_s[i] ?? "∞"} s: ${c} samples`));
  }
  fillTable("checkpoints", snap.checkpoints.history.slice().reverse().slice(0, 12).map(c => [
    String(c.batch_id), String(c.duration_ms), String(c.batch_ms), bytes(c.size_bytes), num(c.state_rows),
    (c.state_rows_growth >= 0 ? "+" : "") + num(c.state_rows_growth)]));
  const points = snap.checkpoints.savepoints.slice().reverse().map(p =>
    `batch ${p.batch_id} at ${stamp(p.at_ms)}${p.stopped ? " (job stopped)" : ""}: ${p.path}`);
  const from = snap.checkpoints.restored_from;
  if (from) points.push(`this job started from ${from.savepoint} (batch ${from.batch_id})`);
  const list = document.getElementById("savepoints");
  list.replaceChildren(...(points.length ? points : ["none taken"]).map(line => {
    const li = document.createElement("li"); li.textContent = line; return li;
  }));
  const dead = Object.entries(snap.dead_letters);
  text("dead-letters", dead.length ? dead.map(([t, n]) => `${t}: ${n.toLocaleString("en-US")}`).join(", ") : "none declared");
  const err = document.getElementById("last-error");
  if (snap.last_error) {
    err.textContent = (snap.last_error.step ? `[${snap.last_error.step}] ` : "") + snap.last_error.message;
    err.className = "has-error";
  } else { err.textContent = "none"; err.className = ""; }
  fillTable("runs", snap.runs.slice().reverse().map(r => [String(r.attempt), stamp(r.started_ms), r.ended ? `${r.ended}${r.ended_ms ? " at " + stamp(r.ended_ms) : ""}` : "running"]));
}

async function poll() {
  try {
    const response = await fetch("api/job", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    text("connection", "");
  } catch (e) {
    text("connection", `not reachable (${e.message}); retrying — a restarted job comes back here`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}
poll();
