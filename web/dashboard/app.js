// kvmesh dashboard: polls the frontend's snapshot every second and shows
// rates and latency percentiles over the last interval (differences of
// Prometheus counters and histogram buckets between two snapshots).
"use strict";

const POLL_MS = 1000;
let prev = null;

// The time-series charts (charts.js), fed one point per poll.
const charts = {
  requests: new Chart("chart-requests", { unit: "/s" }),
  ttft: new Chart("chart-ttft", { unit: " ms" }),
  itl: new Chart("chart-itl", { unit: " ms" }),
  hit: new Chart("chart-hit", { unit: " %", max: 100 }),
  kv: new Chart("chart-kv", { unit: " %", max: 100 }),
  queue: new Chart("chart-queue"),
  qwait: new Chart("chart-qwait", { unit: " ms" }),
  regret: new Chart("chart-regret", { unit: " %", max: 100 }),
  hints: new Chart("chart-hints", { unit: "/s" }),
};

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

// histMean is the mean of a histogram's observations between two
// snapshots (Δsum / Δcount over its series), NaN when none arrived.
function histMean(snap, old, name) {
  const tot = (sn, f) => (sn && sn.metrics[name] || []).reduce((n, s) => n + (s[f] || 0), 0);
  const n = tot(snap, "count") - tot(old, "count");
  return n > 0 ? (tot(snap, "sum") - tot(old, "sum")) / n : NaN;
}

// prefixByModel is kvmesh_router_prefix_tokens_total per model: the tokens
// the chosen workers held (routed) and the most any eligible worker held
// (reachable), the router's regret being their gap.
function prefixByModel(snap) {
  const out = new Map();
  for (const s of (snap && snap.metrics.kvmesh_router_prefix_tokens_total) || []) {
    const l = s.labels || {};
    const m = out.get(l.model) || { routed: 0, reachable: 0 };
    if (l.kind === "routed" || l.kind === "reachable") m[l.kind] += s.value || 0;
    out.set(l.model, m);
  }
  return out;
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

// The fleet's warnings, as /health lists them (e.g. router kv-approx: no
// KV events from the engines).
function renderWarnings(snap) {
  const ws = (snap.fleet && snap.fleet.warnings) || [];
  const ul = $("warnings");
  ul.replaceChildren(...ws.map(w => {
    const li = document.createElement("li");
    li.textContent = w;
    return li;
  }));
  ul.hidden = ws.length === 0;
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
    cell(tr, byTier(w.cached_prompt_tokens_by_tier, w.prompt_tokens), "num");
    cell(tr, byTier(w.credited_cached_tokens, w.routed_prompt_tokens), "num");
    cell(tr, int(w.requests), "num");
    cell(tr, int(w.hints_planned), "num");
    cell(tr, int(w.output_tokens), "num");
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

// byTier shows a worker's cached tokens by tier (what it served, or what
// the router credited) over its prompt tokens as "D 62% · P 5%" (zeros
// left out).
const TIER_ABBR = { device: "D", host: "H", disk: "K", external: "E", peer: "P" };
function byTier(tokens, prompt) {
  if (!(prompt > 0)) return "–";
  const parts = [];
  for (const [tier, abbr] of Object.entries(TIER_ABBR)) {
    const n = (tokens || {})[tier] || 0;
    if (n > 0) parts.push(`${abbr} ${(100 * n / prompt).toFixed(0)}%`);
  }
  return parts.length ? parts.join(" · ") : "0%";
}

// show hides a concept's panel while the fleet does not use it.
function show(id, on) { $(id).hidden = !on; }

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

  renderWarnings(snap);
  renderWorkers(snap);
  const ws = (snap.fleet && snap.fleet.workers) || [];
  recordCharts(snap, ws, rate, hq, isErr);
  renderPairs("router", [
    ["decisions", int(sum(snap, "kvmesh_router_decisions_total"))],
    ["decisions/s", num(rate("kvmesh_router_decisions_total"), 2)],
    ["with a KV hint", int(sum(snap, "kvmesh_router_hints_planned_total"))],
    ["busy rejections", int(sum(snap, "kvmesh_router_busy_rejections_total"))],
    ["prompt tokens routed", int(isl)],
    ...[...prefixByModel(snap)].map(([model, c]) => [`prefix routed / reachable (${model})`, c.reachable > 0 ? pct(c.routed / c.reachable) : "–"]),
    ...(snap.metrics.kvmesh_router_queue_depth ? [
      ["in the router queue now", int(sum(snap, "kvmesh_router_queue_depth"))],
      ["router queue waits (mean)", `${int(sum(snap, "kvmesh_router_queue_seconds"))} (${ms(histMean(snap, null, "kvmesh_router_queue_seconds"))})`],
    ] : []),
    ["migrations", int(sum(snap, "kvmesh_frontend_migrations_total"))],
  ]);
  const decisions = (snap.metrics.kvmesh_router_decisions_total || [])
    .filter(d => (d.value || 0) > 0)
    .map(d => {
      const l = d.labels || {};
      const is = x => x.mode === l.mode && x.path === l.path;
      return [`${l.mode} · ${l.path.replace(/_/g, " ")}`, `${int(d.value)} (${num(rate("kvmesh_router_decisions_total", is), 2)}/s)`];
    });
  renderPairs("decisions", decisions.length ? decisions : [["no decisions yet", "–"]]);

  // Disaggregated prefill/decode: a fleet with prefill or decode workers.
  const nRole = r => ws.filter(w => w.role === r).length;
  const pd = nRole("prefill") + nRole("decode") > 0;
  show("panel-pd", pd);
  if (pd) {
    const byPath = (p, r) => int(sum(snap, "kvmesh_fleet_requests_by_path_total", l => l.path === p && (r === undefined || l.reason === r)));
    const hq = q => quantile(q, buckets(snap, "kvmesh_fleet_disagg_handoff_seconds"), prev && buckets(prev, "kvmesh_fleet_disagg_handoff_seconds"));
    renderPairs("pd", [
      ["prefill / decode / aggregated workers", `${nRole("prefill")} / ${nRole("decode")} / ${nRole("aggregated")}`],
      ["requests disaggregated", byPath("disagg")],
      ["prefilled on the decode worker (short, busy, failed)", `${byPath("local_prefill", "isl")} / ${byPath("local_prefill", "prefill_busy")} / ${byPath("local_prefill", "prefill_failed")}`],
      ["served aggregated", byPath("aggregated")],
      ["handoff p50 / p99", `${ms(hq(0.5))} / ${ms(hq(0.99))}`],
      ["KV pulled by decode workers", bytes(sum(snap, "kvmesh_disagg_handoff_bytes_total"))],
      ["blocks pinned for decode now", int(sum(snap, "kvmesh_disagg_pinned_blocks"))],
      ["prefill retries / recomputes", `${int(sum(snap, "kvmesh_fleet_prefill_retries_total"))} / ${int(sum(snap, "kvmesh_disagg_recomputes_total"))}`],
    ]);
  }

  // KV tiers: workers that registered host or disk capacity (KVBM).
  const tiered = ws.filter(w => Object.entries(w.kv_capacity || {}).some(([t, n]) => t !== "device" && n > 0));
  show("panel-tiers", tiered.length > 0);
  if (tiered.length > 0) {
    const cap = t => int(tiered.reduce((n, w) => n + ((w.kv_capacity || {})[t] || 0), 0));
    const credit = t => {
      const routed = tiered.reduce((n, w) => n + (w.routed_prompt_tokens || 0), 0);
      const got = tiered.reduce((n, w) => n + ((w.credited_cached_tokens || {})[t] || 0), 0);
      return routed > 0 ? pct(got / routed) : "–";
    };
    renderPairs("tiers", [
      ["workers with host or disk tiers", `${tiered.length} of ${ws.length}`],
      ["capacity device / host / disk (blocks)", `${cap("device")} / ${cap("host")} / ${cap("disk")}`],
      ["held on host / disk now (blocks)", `${int(sum(snap, "kvmesh_kvbm_host_blocks"))} / ${int(sum(snap, "kvmesh_kvbm_disk_blocks"))}`],
      ["router credit on host / disk", `${credit("host")} / ${credit("disk")}`],
      ["onboarded from host / disk (blocks)", `${int(sum(snap, "kvmesh_kvbm_onboarded_host_blocks_total"))} / ${int(sum(snap, "kvmesh_kvbm_onboarded_disk_blocks_total"))}`],
      ["offloaded to host / disk (blocks)", `${int(sum(snap, "kvmesh_kvbm_offloaded_host_blocks_total"))} / ${int(sum(snap, "kvmesh_kvbm_offloaded_disk_blocks_total"))}`],
    ]);
  }

  // Hints and transfers: workers that take hints or serve peers.
  const hinted = ws.filter(w => w.hints).length;
  show("panel-hints", hinted > 0);
  if (hinted > 0) {
    const hint = r => int(sum(snap, "kvmesh_kv_hint_results_total", l => l.result === r));
    const outcome = o => sum(snap, "kvmesh_worker_kv_hint_outcomes_total", l => l.outcome === o);
    renderPairs("transfers", [
      ["workers taking hints or serving peers", `${hinted} of ${ws.length}`],
      ["hints fetched / partial / fallback", `${hint("fetched")} / ${hint("partial")} / ${hint("fallback")}`],
      // Every planned hint ends once: dropped counts the fleet's drops too.
      ["hints planned = delivered + dropped + failed", `${int(sum(snap, "kvmesh_fleet_worker_kv_hints_planned_total"))} = ${int(outcome("delivered"))} + ${int(outcome("dropped") + sum(snap, "kvmesh_fleet_kv_hints_dropped_total"))} + ${int(outcome("failed"))}`],
      ["bytes fetched", bytes(sum(snap, "kvmesh_transfer_bytes_total", l => l.operation === "fetch"))],
      ["bytes served", bytes(sum(snap, "kvmesh_transfer_bytes_total", l => l.operation === "serve"))],
      ["fetch rate", bytes(rate("kvmesh_transfer_bytes_total", l => l.operation === "fetch")) + "/s"],
      ["transfers in flight", int(sum(snap, "kvmesh_transfer_in_flight"))],
    ]);
  }

  // Engines: workers in front of real engines (not the simulator).
  const kinds = new Map();
  for (const w of ws) {
    if (w.engine && w.engine !== "sim") kinds.set(w.engine, (kinds.get(w.engine) || 0) + 1);
  }
  show("panel-engines", kinds.size > 0);
  if (kinds.size > 0) {
    const rows = [...kinds].sort().map(([k, n]) => [k, `${n} worker${n === 1 ? "" : "s"}`]);
    if (snap.metrics.kvmesh_kv_event_relay_batches_total) {
      rows.push(["KV event batches relayed / gaps / lost", `${int(sum(snap, "kvmesh_kv_event_relay_batches_total"))} / ${int(sum(snap, "kvmesh_kv_event_relay_gaps_total"))} / ${int(sum(snap, "kvmesh_kv_event_relay_lost_total"))}`]);
    }
    renderPairs("engines", rows);
  }
}

// recordCharts adds this poll's point to every chart and redraws them.
// Rates and percentiles are over the interval since the previous poll; the
// first poll has none.
function recordCharts(snap, ws, rate, hq, isErr) {
  const t = snap.time_unix_ms;
  if (prev) {
    const c = charts;
    c.requests.record(t, "requests", rate("kvmesh_frontend_requests_total"));
    c.requests.record(t, "errors", rate("kvmesh_frontend_requests_total", isErr));
    for (const [chart, name] of [[c.ttft, "kvmesh_frontend_time_to_first_token_seconds"], [c.itl, "kvmesh_frontend_inter_token_latency_seconds"]]) {
      chart.record(t, "p50", 1000 * hq(name, 0.5));
      chart.record(t, "p99", 1000 * hq(name, 0.99));
    }
    const ratio = (num, den) => {
      const d = sum(snap, den) - sum(prev, den);
      return d > 0 ? 100 * (sum(snap, num) - sum(prev, num)) / d : NaN;
    };
    c.hit.record(t, "achieved", ratio("kvmesh_fleet_worker_cached_prompt_tokens_total", "kvmesh_fleet_worker_prompt_tokens_total"));
    c.hit.record(t, "predicted", ratio("kvmesh_router_predicted_cached_tokens_total", "kvmesh_router_isl_tokens_total"));
    if (ws.some(w => w.hints)) {
      c.hints.fig.hidden = false;
      for (const r of ["fetched", "partial", "fallback"]) c.hints.record(t, r, rate("kvmesh_kv_hint_results_total", l => l.result === r));
    }
  }
  for (const w of ws) {
    charts.kv.record(t, `${w.instance}/${w.dp_rank}`, w.total_blocks > 0 ? 100 * w.used_blocks / w.total_blocks : NaN);
  }
  charts.queue.record(t, "waiting on engines", ws.reduce((n, w) => n + (w.waiting || 0), 0));
  // The router's own queue, where the fleet runs one (--router-queue on):
  // its depth beside the engines' queues, and the wait of the requests it
  // dispatched in the interval (mean from the histogram's sum and count,
  // p99 from its buckets).
  if (snap.metrics.kvmesh_router_queue_depth) {
    charts.queue.record(t, "in the router queue", sum(snap, "kvmesh_router_queue_depth"));
  }
  if (snap.metrics.kvmesh_router_queue_seconds) {
    charts.qwait.fig.hidden = false;
    if (prev) {
      charts.qwait.record(t, "mean", 1000 * histMean(snap, prev, "kvmesh_router_queue_seconds"));
      charts.qwait.record(t, "p99", 1000 * hq("kvmesh_router_queue_seconds", 0.99));
    }
  }
  // Routing regret per model: the prefix tokens the chosen workers held
  // over the most any eligible worker held, in the interval.
  if (prev && snap.metrics.kvmesh_router_prefix_tokens_total) {
    charts.regret.fig.hidden = false;
    const now = prefixByModel(snap), then = prefixByModel(prev);
    for (const [model, c] of now) {
      const o = then.get(model) || { routed: 0, reachable: 0 };
      const reach = c.reachable - o.reachable;
      charts.regret.record(t, model, reach > 0 ? 100 * (c.routed - o.routed) / reach : NaN);
    }
  }
  for (const chart of Object.values(charts)) if (!chart.fig.hidden) chart.draw(t);
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
