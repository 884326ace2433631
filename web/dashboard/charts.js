// kvmesh dashboard charts: time series kept in the page (one point per
// poll, the last WINDOW_MS) and drawn as SVG lines. No library: a chart is
// a few polylines, two grid lines and a legend. Colours come from
// style.css classes (the CSP allows no inline style attributes).
"use strict";

const WINDOW_MS = 5 * 60 * 1000;
// A fresh page draws its first minute across the whole width, then widens
// to the window as points accumulate.
const MIN_SPAN_MS = 60 * 1000;
const SVG_NS = "http://www.w3.org/2000/svg";
const W = 400, H = 150, PAD_L = 40, PAD_R = 6, PAD_T = 10, PAD_B = 18;

// Series is one line: points [time ms, value] of the last window; a NaN
// value (nothing happened in that interval) breaks the line.
class Series {
  constructor(name) { this.name = name; this.points = []; }
  push(t, v) {
    this.points.push([t, v]);
    while (this.points.length && this.points[0][0] < t - WINDOW_MS) this.points.shift();
  }
  last() {
    for (let i = this.points.length - 1; i >= 0; i--) if (isFinite(this.points[i][1])) return this.points[i][1];
    return NaN;
  }
}

// Chart draws named series into a <figure>; series appear the first time
// a value is recorded for them (a worker that joins gets its line).
class Chart {
  constructor(id, opts) {
    this.fig = document.getElementById(id);
    this.opts = opts || {};
    this.series = new Map();
    this.svg = document.createElementNS(SVG_NS, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    this.svg.setAttribute("role", "img");
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    this.fig.append(this.svg, this.legend);
  }
  record(t, name, v) {
    let s = this.series.get(name);
    if (!s) { s = new Series(name); this.series.set(name, s); }
    s.push(t, v);
  }
  // draw renders every series over the window ending at now.
  draw(now) {
    let first = now;
    let max = this.opts.max || 0;
    for (const s of this.series.values()) {
      if (s.points.length && s.points[0][0] < first) first = s.points[0][0];
      for (const [, v] of s.points) if (isFinite(v) && v > max) max = v;
    }
    const span = Math.min(WINDOW_MS, Math.max(MIN_SPAN_MS, now - first));
    const t0 = now - span;
    if (!(max > 0)) max = 1;
    max = niceCeil(max);
    const x = t => PAD_L + (W - PAD_L - PAD_R) * (t - t0) / span;
    const y = v => H - PAD_B - (H - PAD_T - PAD_B) * Math.min(v, max) / max;
    const kids = [
      line(PAD_L, y(0), W - PAD_R, y(0), "axis"),
      line(PAD_L, y(max), W - PAD_R, y(max), "grid"),
      line(PAD_L, y(max / 2), W - PAD_R, y(max / 2), "grid"),
      text(PAD_L - 4, y(max) + 4, fmtAxis(max), "end"),
      text(PAD_L - 4, y(0) + 4, "0", "end"),
      text(PAD_L, H - 3, "−" + fmtSpan(span), "start"),
      text(W - PAD_R, H - 3, "now", "end"),
    ];
    const items = [];
    let i = 0;
    for (const s of this.series.values()) {
      const cls = "s" + (i++ % 8);
      for (const run of runs(s.points)) {
        const pl = document.createElementNS(SVG_NS, "polyline");
        pl.setAttribute("class", "line " + cls);
        pl.setAttribute("points", run.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
        kids.push(pl);
      }
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.className = "swatch " + cls;
      item.append(swatch, `${s.name} ${fmtValue(s.last(), this.opts)}`);
      items.push(item);
    }
    this.svg.replaceChildren(...kids);
    this.legend.replaceChildren(...items);
    this.fig.dataset.points = String([...this.series.values()].reduce((n, s) => n + s.points.filter(p => isFinite(p[1])).length, 0));
  }
}

// runs splits points into stretches of finite values (a gap breaks a line).
function runs(points) {
  const out = [];
  let cur = [];
  for (const p of points) {
    if (isFinite(p[1])) { cur.push(p); continue; }
    if (cur.length) out.push(cur);
    cur = [];
  }
  if (cur.length) out.push(cur);
  return out.map(r => r.length === 1 ? [r[0], [r[0][0] + 1, r[0][1]]] : r);
}

function line(x1, y1, x2, y2, cls) {
  const l = document.createElementNS(SVG_NS, "line");
  for (const [k, v] of Object.entries({ x1, y1, x2, y2, class: cls })) l.setAttribute(k, v);
  return l;
}

function text(x, y, s, anchor) {
  const t = document.createElementNS(SVG_NS, "text");
  t.setAttribute("x", x);
  t.setAttribute("y", y);
  t.setAttribute("text-anchor", anchor);
  t.textContent = s;
  return t;
}

// niceCeil rounds an axis maximum up to 1, 2 or 5 times a power of ten.
function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function fmtSpan(ms) {
  const s = Math.round(ms / 1000);
  return s % 60 === 0 ? `${s / 60} min` : s > 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
}

function fmtAxis(v) { return v >= 1000 ? (v / 1000) + "k" : String(+v.toPrecision(3)); }

function fmtValue(v, opts) {
  if (!isFinite(v)) return "–";
  const d = v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return v.toFixed(d) + (opts.unit || "");
}
