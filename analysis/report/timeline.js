// stepscope report: the timeline viewer (plain JS, inlined; reads #tl-data, draws on a canvas).
// Drawing costs O(pixels), not O(events): in each row, items narrower than a pixel are
// merged into one coverage bar per pixel column by skipping ahead with a binary search.
// Every string from the run goes into the page through textContent or fillText.
(async function () {
  "use strict";
  const dataEl = document.getElementById("tl-data");
  const box = document.getElementById("tl");
  if (!dataEl || !box) return;
  const P = JSON.parse(dataEl.textContent);
  const M = P.meta, A = P.arrays, N = M.items;

  async function decode(s, T) {  // base64 of gzip (timeline.py): inflated by the browser
    if (s === undefined) return null;
    const bin = atob(s), n = bin.length, u8 = new Uint8Array(n);
    for (let i = 0; i < n; i++) u8[i] = bin.charCodeAt(i);
    const inflated = new Blob([u8]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new T(await new Response(inflated).arrayBuffer());
  }
  let gap, du, nameOf, catOf, argOf, countOf, fillOf;
  try {
    [gap, du, nameOf, catOf, argOf, countOf, fillOf] = await Promise.all([
      decode(A.start, Uint32Array), decode(A.dur, Uint32Array), decode(A.name, M.name_u16 ? Uint16Array : Uint32Array),
      decode(A.cat, Uint8Array), decode(A.arg, Int32Array), decode(A.count, Uint32Array), decode(A.fill, Uint8Array)]);
  } catch (e) {
    box.textContent = "This browser cannot inflate the timeline (" + e + "); the Perfetto export has every event.";
    return;
  }
  const start = new Float64Array(N), end = new Float64Array(N), maxEnd = new Float64Array(N);
  const rowOff = M.row_off, rowLen = M.row_len, nRows = rowOff.length;
  {
    let os = 0, od = 0;
    for (let r = 0; r < nRows; r++) {
      let t = 0, me = -Infinity;
      for (let i = rowOff[r], hi = rowOff[r] + rowLen[r]; i < hi; i++) {
        let g = gap[i]; if (g === 0xFFFFFFFF) g = M.overflow_start[os++];
        let d = du[i]; if (d === 0xFFFFFFFF) d = M.overflow_dur[od++];
        t += g; start[i] = t; end[i] = t + d;
        if (end[i] > me) me = end[i];
        maxEnd[i] = me;  // monotonic: binary-searchable even if spans of a row overlap
      }
    }
  }
  const names = M.names, cats = M.cats;
  const detailed = new Set((M.detail_steps || []).map(s => s.mode + " " + s.step));
  const GPU_CATS = new Set(["kernel", "memcpy", "memset", "sync", "cuda_runtime"]);

  // --- tree of tracks -------------------------------------------------------------------
  const nodes = M.nodes.map((n, i) => Object.assign({id: i, children: [], collapsed: false}, n));
  const roots = [];
  nodes.forEach(n => (n.parent < 0 ? roots : nodes[n.parent].children).push(n));
  const rowNode = new Int32Array(nRows);
  nodes.forEach(n => n.rows.forEach(r => { rowNode[r] = n.id; }));
  const stepsRowOfProcess = {};
  nodes.forEach(n => { if (n.kind === "steps") stepsRowOfProcess[n.process] = n.rows[0]; });
  const stepsRows = nodes.filter(n => n.kind === "steps").map(n => n.rows[0]);
  // Many threads: start with extra depth rows folded (the first row of each track stays).
  if (nRows > 80) nodes.forEach(n => { if (n.rows.length > 1 && n.kind === "thread") n.collapsed = true; });

  const GUTTER = 240, AXIS = 22, HEAD = 18, ROW = 15;
  let lines = [];  // {y, h, node, row (or -1), depth}
  function layout() {
    lines = [];
    let y = AXIS;
    const walk = (n, depth) => {
      if (n.rows.length === 0) {
        lines.push({y, h: HEAD, node: n, row: -1, depth}); y += HEAD;
        if (!n.collapsed) n.children.forEach(c => walk(c, depth + 1));
        return;
      }
      const shown = n.collapsed ? 1 : n.rows.length;
      for (let k = 0; k < shown; k++) { lines.push({y, h: ROW, node: n, row: n.rows[k], depth, first: k === 0}); y += ROW; }
      n.children.forEach(c => walk(c, depth + 1));
    };
    roots.forEach(r => walk(r, 0));
    return y + 4;
  }

  // --- page elements ------------------------------------------------------------------
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const bar = el("div", {class: "tl-bar"});
  const stepInput = el("input", {type: "number", min: "0", id: "tl-step", placeholder: "step", style: "width:6em"});
  const stepBtn = el("button", {id: "tl-step-go"}, "zoom to step");
  const resetBtn = el("button", {id: "tl-reset"}, "whole run");
  const status = el("span", {class: "muted", id: "tl-status"});
  bar.append(stepInput, stepBtn, resetBtn, el("span", {class: "muted"},
    "  wheel or W/S: zoom, drag or A/D: pan, click: details, click a label: fold  "), status);
  const scroller = el("div", {class: "tl-scroll"});
  const canvas = el("canvas", {id: "tl-canvas", tabindex: "0"});
  scroller.append(canvas);
  const details = el("div", {id: "tl-details", class: "tl-details"});
  box.append(bar, scroller, details);
  const ctx = canvas.getContext("2d");

  let v0 = 0, v1 = Math.max(M.duration_ns, 1000), W = 800, H = 100, selected = -1;
  const ZOOM_MIN_NS = 200;
  function resize() {
    W = Math.max(box.clientWidth, 400);
    H = layout();
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  // --- colours -------------------------------------------------------------------------
  const FIXED = {GetNext: "#e45756", Forward: "#4c78a8", Loss: "#f58518", Backward: "#54a24b",
                 Optimizer: "#b279a2", Recompute: "#72b7b2", "(several names)": "#9a9a9a"};
  const colorCache = new Map();
  function colorOf(i) {
    const nm = nameOf[i];
    if (cats[catOf[i]] === "step") {  // steps kept in full detail stand out
      if (detailed.has(names[nameOf[i]] + " " + argOf[i]) && !(countOf && countOf[i] > 1)) return "#9ecae1";
      return argOf[i] % 2 ? "#c8c8c8" : "#dedede";
    }
    if (cats[catOf[i]] === "comm") return names[nm] === "wait" ? "#c0392b" : "#f2a541";  // blocked on it, in flight
    let c = colorCache.get(nm);
    if (c === undefined) {
      const s = names[nm];
      if (FIXED[s]) c = FIXED[s];
      else { let h = 0; for (let k = 0; k < s.length; k++) h = (h * 31 + s.charCodeAt(k)) | 0; c = "hsl(" + (((h % 360) + 360) % 360) + ",45%,62%)"; }
      colorCache.set(nm, c);
    }
    return c;
  }

  // --- search --------------------------------------------------------------------------
  function firstEndingAfter(lo, hi, t) {  // first i in [lo,hi) with maxEnd[i] >= t
    while (lo < hi) { const m = (lo + hi) >> 1; if (maxEnd[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }
  function firstStartingAt(lo, hi, t) {  // first i in [lo,hi) with start[i] >= t
    while (lo < hi) { const m = (lo + hi) >> 1; if (start[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }

  // --- drawing -------------------------------------------------------------------------
  function fmt(ns) {
    const a = Math.abs(ns);
    if (a >= 1e9) return (ns / 1e9).toFixed(3) + " s";
    if (a >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
    if (a >= 1e3) return (ns / 1e3).toFixed(2) + " µs";
    return ns.toFixed(0) + " ns";
  }
  function drawRow(r, y, h) {
    const lo = rowOff[r], hi = lo + rowLen[r];
    if (lo === hi) return;
    const k = (W - GUTTER) / (v1 - v0);
    let i = firstEndingAfter(lo, hi, v0);
    while (i < hi && start[i] <= v1) {
      const x0 = GUTTER + (start[i] - v0) * k, x1 = GUTTER + (end[i] - v0) * k;
      if (x1 - x0 >= 1) {
        const a = Math.max(x0, GUTTER), b = Math.min(x1, W);
        ctx.fillStyle = colorOf(i);
        ctx.globalAlpha = fillOf && countOf[i] > 1 ? 0.35 + 0.65 * fillOf[i] / 255 : 1;
        ctx.fillRect(a, y + 1, Math.max(b - a, 1), h - 2);
        if (b - a > 36) {
          ctx.globalAlpha = 1; ctx.fillStyle = "#111";
          const label = countOf && countOf[i] > 1 ? countOf[i] + " × " + names[nameOf[i]] :
            cats[catOf[i]] === "step" ? names[nameOf[i]] + " " + argOf[i] : names[nameOf[i]];
          ctx.save(); ctx.beginPath(); ctx.rect(a, y, b - a, h); ctx.clip();
          ctx.fillText(label, a + 2, y + h - 4); ctx.restore();
        }
        if (i === selected) { ctx.globalAlpha = 1; ctx.strokeStyle = "#000"; ctx.lineWidth = 2; ctx.strokeRect(a, y + 1, Math.max(b - a, 2), h - 2); }
        i++;
      } else {
        // everything starting in this pixel column becomes one coverage bar
        const px = Math.floor(x0);
        const j = firstStartingAt(i + 1, hi, v0 + (px + 1 - GUTTER) / k);
        const xe = GUTTER + (maxEnd[j - 1] - v0) * k;
        ctx.fillStyle = colorOf(i); ctx.globalAlpha = 0.85;
        ctx.fillRect(Math.max(px, GUTTER), y + 1, Math.max(Math.min(xe, W) - px, 1), h - 2);
        if (selected >= i && selected < j) { ctx.globalAlpha = 1; ctx.strokeStyle = "#000"; ctx.strokeRect(px - 1, y, 3, h); }
        i = j;
      }
    }
    ctx.globalAlpha = 1;
  }
  function drawAxis() {
    ctx.fillStyle = "#fafafa"; ctx.fillRect(GUTTER, 0, W - GUTTER, AXIS);
    const span = v1 - v0, target = span / ((W - GUTTER) / 110);
    const p = Math.pow(10, Math.floor(Math.log10(target)));
    const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= target) || 10 * p;
    ctx.fillStyle = "#555"; ctx.strokeStyle = "#e4e4e4"; ctx.lineWidth = 1;
    for (let t = Math.ceil(v0 / step) * step; t <= v1; t += step) {
      const x = GUTTER + (t - v0) * (W - GUTTER) / span;
      ctx.fillText(fmt(t), x + 2, 14);
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS - 6); ctx.lineTo(x + 0.5, H); ctx.stroke();
    }
  }
  function drawFlows() {
    if (!M.flows.length) return;
    const yOfRow = new Map();
    lines.forEach(l => { if (l.row >= 0) yOfRow.set(l.row, l.y + l.h / 2); });
    const k = (W - GUTTER) / (v1 - v0);
    ctx.strokeStyle = "#d62728"; ctx.fillStyle = "#d62728"; ctx.lineWidth = 1;
    let drawn = 0;
    for (const [a, b] of M.flows) {
      if (end[a] < v0 && end[b] < v0 || start[a] > v1 && start[b] > v1) continue;
      const ya = yOfRow.get(rowOfItem(a)), yb = yOfRow.get(rowOfItem(b));
      if (ya === undefined || yb === undefined) continue;
      const xa = GUTTER + (start[a] - v0) * k, xb = GUTTER + (start[b] - v0) * k;
      ctx.beginPath(); ctx.moveTo(xa, ya); ctx.lineTo(xb, yb); ctx.stroke();
      ctx.beginPath(); ctx.moveTo(xb, yb); ctx.lineTo(xb - 5, yb - 4); ctx.lineTo(xb - 5, yb + 4); ctx.fill();
      if (++drawn > 2000) break;
    }
  }
  function rowOfItem(i) {  // rows are contiguous in item order
    let lo = 0, hi = nRows - 1;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (rowOff[m] <= i) lo = m; else hi = m - 1; }
    return lo;
  }
  function draw() {
    const t0 = performance.now();
    ctx.clearRect(0, 0, W, H);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "alphabetic";
    drawAxis();
    const top = scroller.scrollTop, bottom = top + scroller.clientHeight;
    for (const l of lines) {
      if (l.y + l.h < top || l.y > bottom) continue;
      if (l.row >= 0) drawRow(l.row, l.y, l.h);
    }
    drawFlows();
    ctx.fillStyle = "#f4f4f4"; ctx.fillRect(0, 0, GUTTER, H);
    ctx.fillStyle = "#222";
    for (const l of lines) {
      if (l.y + l.h < top || l.y > bottom) continue;
      const n = l.node, x = 6 + 12 * l.depth;
      if (l.row < 0 || l.first) {
        const foldable = n.rows.length === 0 ? n.children.length > 0 : n.rows.length > 1;
        const mark = foldable ? (n.collapsed ? "▸ " : "▾ ") : "  ";
        ctx.font = l.row < 0 ? "bold 11px system-ui, sans-serif" : "11px system-ui, sans-serif";
        ctx.save(); ctx.beginPath(); ctx.rect(0, l.y, GUTTER - 4, l.h); ctx.clip();
        ctx.fillText(mark + n.label, x, l.y + l.h - 4); ctx.restore();
      }
      ctx.strokeStyle = "#ececec"; ctx.beginPath(); ctx.moveTo(0, l.y + l.h - 0.5); ctx.lineTo(W, l.y + l.h - 0.5); ctx.stroke();
    }
    ctx.font = "11px system-ui, sans-serif";
    const ms = performance.now() - t0;
    api.lastDrawMs = ms; api.draws++;
    status.textContent = "  " + fmt(v1 - v0) + " shown · drawn in " + ms.toFixed(1) + " ms";
  }
  let pending = false;
  function redraw() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } }

  // --- navigation ----------------------------------------------------------------------
  function setView(a, b) {
    const total = Math.max(M.duration_ns, 1000), pad = total * 0.02;
    let w = Math.max(b - a, ZOOM_MIN_NS);
    w = Math.min(w, total + 2 * pad);
    a = Math.min(Math.max(a, -pad), total + pad - w);
    v0 = a; v1 = a + w;
  }
  function zoomAt(factor, x) {
    const t = v0 + (Math.max(x, GUTTER) - GUTTER) / (W - GUTTER) * (v1 - v0);
    setView(t - (t - v0) * factor, t + (v1 - t) * factor);
  }
  function pan(fraction) { const w = v1 - v0; setView(v0 + fraction * w, v1 + fraction * w); }
  let mouseX = null, drag = null, hover = false;
  canvas.addEventListener("wheel", e => {
    if (e.offsetX < GUTTER) return;  // the gutter scrolls the track list
    e.preventDefault();
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) pan((e.deltaX || e.deltaY) / 800);
    else zoomAt(Math.pow(1.0015, e.deltaY), e.offsetX);
    redraw();
  }, {passive: false});
  canvas.addEventListener("mousedown", e => { drag = {x: e.offsetX, v0, v1, moved: false}; canvas.focus(); });
  window.addEventListener("mousemove", e => {
    if (!drag) return;
    const rect = canvas.getBoundingClientRect(), dx = e.clientX - rect.left - drag.x;
    if (Math.abs(dx) > 3) drag.moved = true;
    if (drag.moved) { const w = drag.v1 - drag.v0; setView(drag.v0 - dx / (W - GUTTER) * w, drag.v1 - dx / (W - GUTTER) * w); redraw(); }
  });
  window.addEventListener("mouseup", e => {
    if (drag && !drag.moved) click(e.clientX - canvas.getBoundingClientRect().left, e.clientY - canvas.getBoundingClientRect().top);
    drag = null;
  });
  canvas.addEventListener("mousemove", e => { mouseX = e.offsetX; });
  canvas.addEventListener("mouseenter", () => { hover = true; });
  canvas.addEventListener("mouseleave", () => { hover = false; });
  const KEYS = {w: () => zoomAt(0.8, mouseX ?? (W + GUTTER) / 2), s: () => zoomAt(1.25, mouseX ?? (W + GUTTER) / 2),
                a: () => pan(-0.15), d: () => pan(0.15)};
  window.addEventListener("keydown", e => {
    const f = KEYS[e.key.toLowerCase()];
    if (!f || e.ctrlKey || e.metaKey || e.altKey) return;
    const typing = document.activeElement && /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
    if (typing || (document.activeElement !== canvas && !hover)) return;
    e.preventDefault(); f(); redraw();
  });
  scroller.addEventListener("scroll", redraw);
  window.addEventListener("resize", () => { resize(); redraw(); });

  // --- details ---------------------------------------------------------------------------
  function lineAt(y) { return lines.find(l => y >= l.y && y < l.y + l.h); }
  function itemAt(r, t, tol) {
    const lo = rowOff[r], hi = lo + rowLen[r];
    let best = -1, bestDist = Infinity;
    let i = firstStartingAt(lo, hi, t + tol) - 1;
    for (let n = 0; i >= lo && n < 64 && maxEnd[i] >= t - tol; i--, n++) {
      const d = t < start[i] ? start[i] - t : t > end[i] ? t - end[i] : 0;
      if (d <= tol && (d < bestDist || (d === bestDist && end[i] - start[i] < end[best] - start[best]))) { best = i; bestDist = d; }
    }
    return best;
  }
  function stepOf(r, t) {
    const sr = stepsRowOfProcess[nodes[rowNode[r]].process];
    if (sr === undefined || rowLen[sr] === 0) return null;
    const i = firstStartingAt(rowOff[sr], rowOff[sr] + rowLen[sr], t + 1) - 1;
    if (i < rowOff[sr] || end[i] <= t) return null;
    return names[nameOf[i]] + " " + argOf[i] + (countOf && countOf[i] > 1 ? " (first of " + countOf[i] + " merged)" : "");
  }
  function click(x, y) {
    const l = lineAt(y);
    if (!l) return;
    if (x < GUTTER) {
      const foldable = l.row < 0 ? l.node.children.length > 0 : l.node.rows.length > 1;
      if (foldable && (l.row < 0 || l.first)) { l.node.collapsed = !l.node.collapsed; resize(); redraw(); }
      return;
    }
    if (l.row < 0) return;
    const k = (W - GUTTER) / (v1 - v0), t = v0 + (x - GUTTER) / k;
    selected = itemAt(l.row, t, 3 / k);
    showDetails(selected, l.row);
    redraw();
  }
  function showDetails(i, r) {
    details.replaceChildren();
    if (i < 0) return;
    const merged = countOf && countOf[i] > 1;
    const cat = cats[catOf[i]];
    const rows = [["name", merged ? names[nameOf[i]] + " (" + countOf[i] + " spans merged)" : names[nameOf[i]]],
                  ["category", cat], ["start", fmt(start[i]) + " after the run's first event"],
                  ["duration", fmt(end[i] - start[i])]];
    if (cat === "step") rows.push(["step", names[nameOf[i]] + " " + argOf[i]]);
    else { const s = stepOf(r, start[i]); if (s) rows.push(["step", s]); }
    if (argOf[i] > 0 && cat !== "step") rows.push(["args", (GPU_CATS.has(cat) ? "correlation " : "arg ") + argOf[i]]);
    if (merged) rows.push(["coverage", Math.round(100 * fillOf[i] / 255) + "% of the span busy; only the steps " +
                           "listed above are here in full detail: export the run to Perfetto for every event"]);
    const n = nodes[rowNode[r]];
    const path = []; for (let p = n; p; p = p.parent >= 0 ? nodes[p.parent] : null) path.unshift(p.label);
    rows.push(["track", path.join(" › ")]);
    const table = el("table");
    rows.forEach(([k, v]) => { const tr = el("tr"); tr.append(el("th", {}, k), el("td", {}, String(v))); table.append(tr); });
    details.append(table);
  }

  function zoomToStep(n, wanted) {  // wanted: a mode; else train, else any
    let a = Infinity, b = -Infinity, mode = null;
    for (const want of wanted ? [wanted] : ["train", null]) {
      for (const r of stepsRows) {
        let found = -1;
        for (let i = rowOff[r], hi = rowOff[r] + rowLen[r]; i < hi; i++) {
          const nm = names[nameOf[i]];
          if (want !== null && nm !== want) continue;
          if (argOf[i] <= n && (countOf ? argOf[i] + countOf[i] > n : argOf[i] === n)) { found = i; if (argOf[i] === n) break; }
        }
        if (found >= 0 && (mode === null || names[nameOf[found]] === mode)) {
          mode = names[nameOf[found]]; a = Math.min(a, start[found]); b = Math.max(b, end[found]);
        }
      }
      if (a < b) break;
    }
    if (!(a < b)) { status.textContent = "  no step " + n; return false; }
    const w = b - a;
    setView(a - 0.05 * w, b + 0.05 * w);
    draw();
    return true;
  }
  stepBtn.addEventListener("click", () => { if (stepInput.value !== "") zoomToStep(Number(stepInput.value)); });
  stepInput.addEventListener("keydown", e => { if (e.key === "Enter") stepBtn.click(); });
  resetBtn.addEventListener("click", () => { setView(0, M.duration_ns); draw(); });
  document.querySelectorAll("button.tl-jump").forEach(btn => btn.addEventListener("click", () => {
    zoomToStep(Number(btn.dataset.step), btn.dataset.mode); scroller.scrollIntoView({block: "nearest"});
  }));

  const api = window.stepscopeTimeline = {
    lastDrawMs: 0, draws: 0, items: N,
    view: () => [v0, v1],
    zoom: (factor) => { zoomAt(factor, (W + GUTTER) / 2); draw(); return api.lastDrawMs; },
    setView: (a, b) => { setView(a, b); draw(); return api.lastDrawMs; },
    zoomToStep, draw,
    pointOf: (i) => {  // canvas coordinates of an item's visible middle, for tests
      const l = lines.find(q => q.row === rowOfItem(i)), k = (W - GUTTER) / (v1 - v0);
      const mid = (Math.max(start[i], v0) + Math.min(end[i], v1)) / 2;
      return l ? [GUTTER + (mid - v0) * k, l.y + l.h / 2] : null;
    },
    itemInfo: (i) => ({name: names[nameOf[i]], start: start[i], end: end[i]}),
    findItem: (text, after, cat) => {  // the first item of that name (and category) in view, from `after`; for tests
      for (let i = 0; i < N; i++) {
        if (names[nameOf[i]] === text && end[i] >= v0 && start[i] <= v1 && !(start[i] < after) &&
            (cat === undefined || cats[catOf[i]] === cat)) return i;
      }
      return -1;
    },
  };
  resize();
  setView(0, M.duration_ns);
  draw();
  api.readyMs = performance.now();  // since navigation started
  api.ready = true;
})();
