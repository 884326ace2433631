// kvmesh dashboard: polls the frontend's snapshot every second and shows
// rates and latency percentiles over the last interval (differences of
// Prometheus counters and histogram buckets between two snapshots).
"use strict";

const POLL_MS = 1000;
let prev = null;

function $(id) { return document.getElementById(id); }

// sum adds the values of a family's series whose labels match pred.
function sum(snap, name, pred) {
  const fam = snap.metrics[name];
  if (!fam) return 0;
  let v = 0;
  for (const s of fam) {
    if (!pred || pred(s.labels || {})) v += (s.value !== undefined ? s.value : s.count || 0);
  }
  return v;
}

// buckets merges a histogram family's cumulative buckets over its series.
function buckets(snap, name) {
  const out = new Map();
  for (const s of snap.metrics[name] || []) {
    for (const [le, c] of s.buckets || []) out.set(le, (out.get(le) || 0) + c);
  }
  return out;
}

// quantile over the bucket counts that arrived between two snapshots, by
// linear interpolation inside the bucket (as PromQL's histogram_quantile).
function quantile(q, cur, old) {
  const les = [...cur.keys()].sort((a, b) => a - b);
  const counts = les.map(le => cur.get(le) - (old && old.get(le) || 0));
  const total = counts.length ? counts[counts.length - 1] : 0;
  if (!(total > 0)) return NaN;
  const rank = q * total;
  let lo = 0, below = 0;
  for (let i = 0; i < les.length; i++) {
    if (counts[i] >= rank) {
      const hi = les[i];
      if (!isFinite(hi) || hi >= 1e300) return lo; // the +Inf bucket
      const inBucket = counts[i] - below;
      return inBucket > 0 ? lo + (hi - lo) * (rank - below) / inBucket : hi;
    }
    lo = les[i]; below = counts[i];
  }
  return lo;
}

function ms(s) {
  if (!isFinite(s)) return "–";
  const v = s * 1000;
  return v >= 100 ? v.toFixed(0) + " ms" : v >= 10 ? v.toFixed(1) + " ms" : v.toFixed(2) + " ms";
}
function num(v, d) { return isFinite(v) ? v.toFixed(d === undefined ? 1 : d) : "–"; }
function pct(v) { return isFinite(v) ? (100 * v).toFixed(1) + " %" : "–"; }
function int(v) { return isFinite(v) ? Math.round(v).toLocaleString("en-US") : "–"; }
function bytes(v) {
  if (!isFinite(v)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return v.toFixed(i ? 1 : 0) + " " + u[i];
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function usageBar(used, total) {
  const bar = document.createElement("div");
  bar.className = "bar";
  const fill = document.createElement("div");
  const frac = total > 0 ? used / total : 0;
  fill.style.width = (100 * Math.min(frac, 1)).toFixed(1) + "%";
  const label = document.createElement("span");
  label.textContent = total > 0 ? `${int(used)} / ${int(total)} (${pct(frac)})` : "–";
  bar.append(fill, label);
  return bar;
}

function renderWorkers(snap) {
  const ws = (snap.fleet && snap.fleet.workers) || [];
  $("worker-count").textContent = `(${ws.length})`;
  const body = $("workers").querySelector("tbody");
  const rows = [];
  for (const w of ws) {
    const tr = document.createElement("tr");
    tr.dataset.worker = `${w.instance}/${w.dp_rank}`;
    cell(tr, `${w.instance}/${w.dp_rank}`);
    cell(tr, w.role);
    cell(tr, w.model);
    cell(tr, w.state, w.state);
    cell(tr, int(w.running), "num");
    cell(tr, int(w.waiting), "num");
    cell(tr, int(w.prefill_tokens_queued), "num");
    cell(tr, "").appendChild(usageBar(w.used_blocks, w.total_blocks));
    cell(tr, w.prompt_tokens > 0 ? pct(w.cached_prompt_tokens / w.prompt_tokens) : "–", "num");
    cell(tr, int(w.requests), "num");
    cell(tr, int(w.hints_planned), "num");
    cell(tr, int(w.output_tokens), "num");
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

function renderPairs(id, pairs) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...pairs.map(([k, v]) => {
    const tr = document.createElement("tr");
    cell(tr, k);
    cell(tr, v);
    return tr;
  }));
}

function render(snap) {
  const dt = prev ? (snap.time_unix_ms - prev.time_unix_ms) / 1000 : 0;
  const rate = (name, pred) => dt > 0 ? (sum(snap, name, pred) - sum(prev, name, pred)) / dt : NaN;
  const isErr = l => l.status && !l.status.startsWith("2");

  const reqTotal = sum(snap, "kvmesh_frontend_requests_total");
  $("req-rate").textContent = num(rate("kvmesh_frontend_requests_total"), 2);
  $("req-total").textContent = `${int(reqTotal)} total`;
  $("err-rate").textContent = num(rate("kvmesh_frontend_requests_total", isErr), 2);
  $("err-total").textContent = `${int(sum(snap, "kvmesh_frontend_requests_total", isErr))} total`;
  const hq = (name, q) => quantile(q, buckets(snap, name), prev && buckets(prev, name));
  $("ttft").textContent = `${ms(hq("kvmesh_frontend_time_to_first_token_seconds", 0.5))} / ${ms(hq("kvmesh_frontend_time_to_first_token_seconds", 0.99))}`;
  $("itl").textContent = `${ms(hq("kvmesh_frontend_inter_token_latency_seconds", 0.5))} / ${ms(hq("kvmesh_frontend_inter_token_latency_seconds", 0.99))}`;
  $("tok-rate").textContent = num(rate("kvmesh_fleet_worker_output_tokens_total"), 1);
  $("inflight").textContent = `${int(sum(snap, "kvmesh_frontend_inflight_requests"))} in flight`;
  const prompt = sum(snap, "kvmesh_fleet_worker_prompt_tokens_total");
  $("hit").textContent = prompt > 0 ? pct(sum(snap, "kvmesh_fleet_worker_cached_prompt_tokens_total") / prompt) : "–";
  const isl = sum(snap, "kvmesh_router_isl_tokens_total");
  $("hit-pred").textContent = isl > 0 ? `router predicted ${pct(sum(snap, "kvmesh_router_predicted_cached_tokens_total") / isl)}` : "";

  renderWorkers(snap);
  renderPairs("router", [
    ["decisions", int(sum(snap, "kvmesh_router_decisions_total"))],
    ["decisions/s", num(rate("kvmesh_router_decisions_total"), 2)],
    ["with a KV hint", int(sum(snap, "kvmesh_router_hints_planned_total"))],
    ["busy rejections", int(sum(snap, "kvmesh_router_busy_rejections_total"))],
    ["prompt tokens routed", int(isl)],
    ["migrations", int(sum(snap, "kvmesh_frontend_migrations_total"))],
  ]);
  const hint = r => int(sum(snap, "kvmesh_kv_hint_results_total", l => l.result === r));
  renderPairs("transfers", [
    ["hints fetched / partial / fallback", `${hint("fetched")} / ${hint("partial")} / ${hint("fallback")}`],
    ["bytes fetched", bytes(sum(snap, "kvmesh_transfer_bytes_total", l => l.operation === "fetch"))],
    ["bytes served", bytes(sum(snap, "kvmesh_transfer_bytes_total", l => l.operation === "serve"))],
    ["fetch rate", bytes(rate("kvmesh_transfer_bytes_total", l => l.operation === "fetch")) + "/s"],
    ["transfers in flight", int(sum(snap, "kvmesh_transfer_in_flight"))],
  ]);
}

async function poll() {
  try {
    const resp = await fetch("api/snapshot", { cache: "no-store" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const snap = await resp.json();
    render(snap);
    prev = snap;
    $("status").textContent = "live";
    $("status").className = "status ok";
    $("updated").textContent = "updated " + new Date(snap.time_unix_ms).toLocaleTimeString();
  } catch (e) {
    $("status").textContent = "disconnected";
    $("status").className = "status bad";
  }
  setTimeout(poll, POLL_MS);
}

poll();
