"""``stepscope report``: one self-contained HTML file (plotly inlined, opens offline).

Sections: verdict (findings with recommendations), job summary, step time,
system, GPU (only with GPU activity), timeline (a canvas viewer:
timeline.py builds its data, timeline.js draws it), run metadata. Every
user-supplied string (names, command line, messages) is escaped; plots are
drawn when scrolled near, so a large report opens at once.
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.run import Run
from stepscope.core.vocabulary import OTHER, PHASES, REPORT_FILE
from stepscope.analysis.timeline import DETAIL_CAP

COLORS = dict(zip((*PHASES, OTHER), ("#e45756", "#4c78a8", "#f58518", "#54a24b", "#b279a2", "#bab0ac")))


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


MAX_STEP_POINTS = 3000  # per process and mode; longer runs are shown as means of consecutive steps

# Figures are drawn when scrolled near, so a page with many of them opens at once.
PLOT_LOADER = """(function () {
  var draw = function (div) {
    if (div.dataset.drawn) return;
    div.dataset.drawn = "1";
    var fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
    Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
  };
  var plots = document.querySelectorAll("div.plot");
  if ("IntersectionObserver" in window) {
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting) { seen.unobserve(e.target); draw(e.target); } });
    }, {rootMargin: "400px"});
    plots.forEach(function (d) { seen.observe(d); });
  } else plots.forEach(draw);
  window.stepscopeDrawPlots = function () { plots.forEach(draw); };
})();"""


def _figure_html(fig, key: str) -> str:
    from stepscope.analysis.timeline import script_json

    height = fig.layout.height or 450
    return (f'<div class="plot" id="{key}" style="min-height:{int(height)}px"></div>'
            f'<script type="application/json" id="{key}-data">{script_json(json.loads(fig.to_json()))}</script>')


def _thin(s: pd.DataFrame, columns) -> pd.DataFrame:
    """At most MAX_STEP_POINTS rows: means of consecutive steps (the first step number kept)."""
    if len(s) <= MAX_STEP_POINTS:
        return s
    group = np.arange(len(s)) * MAX_STEP_POINTS // len(s)
    out = s[list(columns)].groupby(group).mean()
    out["step"] = s["step"].to_numpy()[np.searchsorted(group, out.index)]
    return out


def _loop_notes(summary: dict) -> str:
    """What the summary says about a loop stepscope did not understand (analysis/loop.py)."""
    out = []
    for n in summary.get("loop_notes", []):
        evidence = json.dumps(n["evidence"], indent=1, default=str)
        out.append(f'<div class="finding loop-note" id="note-{_esc(n["key"])}"><h3>{_esc(n["title"])}</h3>'
                   f'<p>{_esc(n["message"])}</p><p class="rec">{_esc(n["recommendation"])}</p>'
                   f'<details><summary>evidence</summary><pre>{_esc(evidence)}</pre></details></div>')
    return "\n".join(out)


def _verdict(summary: dict) -> str:
    findings = summary["findings"]
    notes = _loop_notes(summary)
    if not findings and notes:
        body = notes
    elif not findings:
        body = '<p class="ok">No problems found.</p>'
    else:
        items = []
        for f in findings:
            evidence = json.dumps(f["evidence"], indent=1, default=str)
            items.append(f'<div class="finding {_esc(f["severity"])}"><h3>{_esc(f["rule"])}</h3>'
                         f'<p>{_esc(f["message"])}</p><p class="rec">{_esc(f["recommendation"])}</p>'
                         f'<details><summary>evidence</summary><pre>{_esc(evidence)}</pre></details></div>')
        body = "\n".join(([notes] if notes else []) + items)
    skipped = summary.get("rules_not_applicable", {})
    if skipped:
        body += "<p class='muted'>Not applicable to this run: " + "; ".join(
            f"{_esc(k)} ({_esc(v)})" for k, v in skipped.items()) + "</p>"
    return body


def _job_summary(run: Run, summary: dict) -> str:
    steps = run.steps
    procs = run.processes
    ev = run.events
    rows = []
    start = run.info.get("start_time")
    if start:
        rows.append(("start", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(start)))))
    rows.append(("duration", f"{summary['duration_s']:.2f} s"))
    if len(steps) and len(ev):
        t0, t1 = int(ev["start_ns"].min()), int(ev["end_ns"].max())
        s0, s1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
        total = max(t1 - t0, 1)
        for label, a, b in (("initialization", t0, s0), ("training loop", s0, s1), ("finalization", s1, t1)):
            rows.append((label, f"{(b - a) / 1e9:.2f} s ({100 * (b - a) / total:.0f}%)"))
    for mode, st in summary["steps"].items():
        rows.append((f"{mode} steps", f"{st['count']} (median {st['median_ms']:.2f} ms, p95 {st['p95_ms']:.2f} ms)"))
    rows.append(("ranks", str(summary["ranks"])))
    rows.append(("hosts", ", ".join(sorted({str(h) for h in procs["host"].dropna()}))))
    rows.append(("processes", str(len(procs))))
    return "<table>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _step_figures(run: Run):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steps = run.steps.copy()
    if steps.empty:
        return []
    steps["ms"] = steps["duration_ns"] / 1e6
    steps["label"] = steps["process"].astype(str)
    figs = []
    hist = go.Figure()
    for mode, s in steps.groupby("mode", observed=True):
        counts, edges = np.histogram(s["ms"], bins=min(100, max(10, int(np.sqrt(len(s))))))
        hist.add_trace(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges), name=str(mode),
                              opacity=0.75))
    hist.update_layout(title="Step time distribution", xaxis_title="ms", yaxis_title="steps", barmode="overlay")
    figs.append(hist)

    over = go.Figure()
    for (label, mode), s in steps.groupby(["label", "mode"], observed=True):
        med = s["ms"].median()
        outlier = s["ms"] > 2 * med
        shown = _thin(s, ["ms", "step"])
        over.add_trace(go.Scattergl(x=shown["step"], y=shown["ms"], mode="markers", name=f"{label} {mode}"
                                    + (" (means of consecutive steps)" if len(shown) < len(s) else ""),
                                    marker={"size": 4}))
        if outlier.sum() > MAX_STEP_POINTS:
            outlier &= s["ms"] >= s["ms"][outlier].nlargest(MAX_STEP_POINTS).min()
        if outlier.any():
            over.add_trace(go.Scattergl(x=s["step"][outlier], y=s["ms"][outlier], mode="markers",
                                        name=f"{label} {mode} outliers (> 2x median)",
                                        marker={"size": 9, "symbol": "x", "color": "#e45756"}))
    over.update_layout(title="Step time over the run", xaxis_title="step", yaxis_title="ms")
    figs.append(over)

    train = steps[steps["mode"] == "train"] if (steps["mode"] == "train").any() else steps
    labels = sorted(train["label"].unique())
    stacked = make_subplots(rows=len(labels), cols=1, shared_xaxes=True, subplot_titles=labels,
                            vertical_spacing=0.08 if len(labels) > 1 else 0.1)
    for row, label in enumerate(labels, start=1):
        s = _thin(train[train["label"] == label], [*PHASES, "Other"])
        for part in (*PHASES, "Other"):
            stacked.add_trace(go.Bar(x=s["step"], y=s[part] / 1e6, name=part, marker_color=COLORS[part],
                                     legendgroup=part, showlegend=row == 1), row=row, col=1)
    stacked.update_layout(title="Phase breakdown per train step (per rank)", barmode="stack",
                          yaxis_title="ms", height=260 + 220 * len(labels))
    figs.append(stacked)
    return figs


def _system_figures(run: Run):
    import plotly.graph_objects as go

    system = run.system
    if system.empty:
        return []
    figs = []
    marks = run.steps["start_ns"].to_numpy() if len(run.steps) else np.array([])
    for node, s in system.groupby("node"):
        cpu = s[(s["metric"] == "cpu_util")]
        if not cpu.empty:
            allc = cpu[cpu["device"] == "all"]
            fig = go.Figure(go.Scattergl(x=allc["timestamp"], y=allc["value"], name="all cores", mode="lines"))
            fig.update_layout(title=f"{_esc(node)}: CPU utilization (mean of cores)", yaxis_title="%",
                              yaxis_range=[0, 100])
            if 0 < len(marks) <= 200:
                for t in pd.to_datetime(marks, unit="ns", utc=True):
                    fig.add_vline(x=t, line_width=0.5, line_color="#bbb")
            figs.append(fig)
            cores = cpu[cpu["device"] != "all"].pivot_table(index="device", columns="timestamp", values="value")
            order = sorted(cores.index, key=lambda d: int(d[3:]) if d[3:].isdigit() else 0)
            cores = cores.loc[order]
            heat = go.Figure(go.Heatmap(z=cores.to_numpy(), x=cores.columns, y=cores.index, zmin=0, zmax=100,
                                        colorscale="Viridis", colorbar={"title": "%"}))
            heat.update_layout(title=f"{_esc(node)}: CPU utilization per core", height=200 + 12 * len(cores))
            figs.append(heat)
        for metric, title, unit in (("mem_used", "memory used", "bytes"),
                                    ("disk_read_bytes_per_s", "disk read", "bytes/s"),
                                    ("disk_write_bytes_per_s", "disk write", "bytes/s"),
                                    ("net_rx_bytes_per_s", "network receive", "bytes/s"),
                                    ("net_tx_bytes_per_s", "network transmit", "bytes/s")):
            part = s[s["metric"] == metric]
            if part.empty or not part["value"].any():
                continue
            fig = go.Figure()
            for device, d in part.groupby("device"):
                fig.add_trace(go.Scattergl(x=d["timestamp"], y=d["value"], name=str(device) or metric, mode="lines"))
            fig.update_layout(title=f"{_esc(node)}: {title}", yaxis_title=unit)
            figs.append(fig)
    rss = system[system["metric"] == "proc_rss"]
    if not rss.empty:
        fig = go.Figure()
        for (process, device), d in rss.groupby(["process", "device"]):
            fig.add_trace(go.Scattergl(x=d["timestamp"], y=d["value"] / 2**20, mode="lines",
                                       name=f"{process} {device}"))
        fig.update_layout(title="Resident memory per process (and its workers)", yaxis_title="MiB")
        figs.append(fig)
    return figs


def _timeline(run: Run, cap: int) -> str:
    """The canvas viewer (timeline.js, inlined) and its data (timeline.py)."""
    from stepscope.analysis.timeline import script_json, timeline_data

    data = timeline_data(run, cap)
    if data is None:
        return "<p class='muted'>No events.</p>"
    meta = data["meta"]
    note = ""
    if meta["quantum_ns"]:
        note = (f"<p class='muted' id='tl-capped'>This run has {meta['spans']:,} spans; the page keeps the ones "
                f"longer than {meta['quantum_ns'] / 1e3:g} µs whole and merges shorter ones into coverage bars "
                f"({meta['items']:,} items). Every event: <code>stepscope export {_esc(run.name)} --format perfetto"
                "</code>, then open the file in ui.perfetto.dev.</p>")
    else:
        note = ("<p class='muted'>Every event is here. For Perfetto: <code>stepscope export "
                f"{_esc(run.name)} --format perfetto</code>.</p>")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "timeline.js"), encoding="utf-8") as f:
        js = f.read()
    return (f"{note}<div id='tl'></div><script type='application/json' id='tl-data'>{script_json(data)}</script>"
            f"<script>{js}</script>")


TOP_KERNELS = 15


def _gpu_section(run: Run):
    """SageMaker Profiler's dashboard: (summary table, figures), or None without GPU activity."""
    import plotly.graph_objects as go

    from stepscope.analysis.gpu_activity import busy_ns, device_operations

    ops = device_operations(run)
    kernels = ops[ops["kind"] == "kernel"]
    if kernels.empty:
        return None
    ev = run.events
    t0 = min(int(ev["start_ns"].min()) if len(ev) else ops["start_ns"].min(), int(ops["start_ns"].min()))
    t1 = max(int(ev["end_ns"].max()) if len(ev) else ops["end_ns"].max(), int(ops["end_ns"].max()))
    wall = max(t1 - t0, 1)
    rows = []
    for device, d in ops.groupby("device", sort=True):
        k = d[d["kind"] == "kernel"]
        busy = busy_ns(k["start_ns"].to_numpy(), k["end_ns"].to_numpy())
        rows.append((f"GPU {device} active (kernels running)",
                     f"{busy / 1e9:.3f} s of {wall / 1e9:.3f} s ({100 * busy / wall:.1f}%), {len(k):,} kernels"))
    phases = run.phases
    if len(phases):
        cpu = busy_ns(phases["start_ns"].to_numpy(), phases["end_ns"].to_numpy())
        rows.append(("CPU active (inside a phase)", f"{cpu / 1e9:.3f} s ({100 * cpu / wall:.1f}%)"))
    head = "<table>" + "".join(f"<tr><th>{_esc(a)}</th><td>{_esc(b)}</td></tr>" for a, b in rows) + "</table>"
    figs = []
    by_name = kernels.groupby("name").agg(time_ms=("duration_ns", lambda x: x.sum() / 1e6),
                                          launches=("duration_ns", "size"))
    for column, title, unit, fmt in (("time_ms", "Kernel time, top 15", "ms", ",.1f"),
                                     ("launches", "Kernel launches, top 15", "launches", ",.0f")):
        top = by_name.nlargest(TOP_KERNELS, column).iloc[::-1]
        all_ = by_name[column].sum()
        fig = go.Figure(go.Bar(x=top[column], y=[_esc(n if len(n) <= 60 else n[:57] + "...") for n in top.index],
                               orientation="h", hovertext=[_esc(n) for n in top.index], marker_color="#4c78a8"))
        fig.update_layout(title=f"{title} (all {len(by_name)} kernels: {all_:{fmt}} {unit})", xaxis_title=unit,
                          height=220 + 22 * len(top), margin={"l": 320})
        figs.append(fig)
    if "precision" in run.kernels.columns:
        prec = run.kernels.groupby(run.kernels["precision"].astype(str))["duration_ns"].sum() / 1e6
        fig = go.Figure(go.Pie(labels=list(prec.index), values=prec.to_numpy(), hole=0.4))
        fig.update_layout(title="Kernel precision (share of kernel time)")
        figs.append(fig)
    activity = ops.groupby("kind")["duration_ns"].sum() / 1e6
    labels = {"kernel": "kernels", "memcpy": "memcpy", "memset": "memset", "sync": "sync"}
    fig = go.Figure(go.Pie(labels=[labels.get(k, k) for k in activity.index], values=activity.to_numpy(), hole=0.4))
    fig.update_layout(title="GPU activity (share of time: kernels / memcpy / memset / sync)")
    figs.append(fig)
    mem = ops[ops["kind"].isin(["memcpy", "memset"])]
    if len(mem):
        m = mem.groupby("name")["duration_ns"].agg(["sum", "size"])
        fig = go.Figure(go.Bar(x=list(m.index), y=m["sum"] / 1e6, text=[f"{n:,} ops" for n in m["size"]]))
        fig.update_layout(title="Memory operations (time by kind)", yaxis_title="ms")
        figs.append(fig)
    util = run.system[run.system["metric"] == "gpu_util"] if len(run.system) else run.system
    if len(util):
        fig = go.Figure()
        for (node, device), d in util.groupby(["node", "device"]):
            fig.add_trace(go.Scattergl(x=d["timestamp"], y=d["value"], mode="lines", name=f"{node} {device}"))
        fig.update_layout(title="GPU utilization over time", yaxis_title="%", yaxis_range=[0, 100])
        figs.append(fig)
    return head, figs


def _metadata(run: Run, summary: dict) -> str:
    info = dict(run.info)
    rows = [("run", run.name), ("path", run.path), ("command", " ".join(map(str, info.get("command", [])))),
            ("versions", json.dumps(info.get("versions", {}))), ("config", json.dumps(info.get("config", {}))),
            ("dropped events", summary["dropped_events"])]
    for note in run.notes:
        rows.append(("not measured", note))
    for w in run.warnings:
        rows.append(("read warning", w))
    return "<table>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse}th{text-align:left;padding:.2em 1em .2em 0;color:#555;vertical-align:top}
td{padding:.2em 0}.finding{border-left:4px solid #e45756;padding:.2em 1em;margin:1em 0;background:#fdf3f3}
.finding.info{border-color:#4c78a8;background:#f3f6fb}
.finding.loop-note{border-color:#f58518;background:#fff7ec}.finding h3{margin:.3em 0}.rec{color:#333;font-style:italic}
.ok{color:#2a7a2a;font-weight:bold}.muted{color:#777;font-size:.9em}pre{white-space:pre-wrap;font-size:.85em}
nav a{margin-right:1em}
#tl{margin-top:.5em}.tl-bar{margin:.3em 0}.tl-bar button,.tl-bar input{margin-right:.4em}
.tl-scroll{max-height:640px;overflow-y:auto;border:1px solid #ddd}#tl-canvas{display:block;outline:none}
.tl-details{min-height:3em;margin-top:.4em;font-size:.9em}
"""


def render(run: Run, params: Optional[dict] = None, timeline_cap: int = DETAIL_CAP) -> str:
    from stepscope.analysis.summary import summarize

    summary = summarize(run, params)
    sections = [("verdict", "Verdict", _verdict(summary)), ("summary", "Job summary", _job_summary(run, summary))]
    figure_sections = [("steps", "Step time", "", _step_figures(run)), ("system", "System", "", _system_figures(run))]
    gpu = _gpu_section(run)
    if gpu is not None:  # only where the run has GPU activity
        figure_sections.append(("gpu", "GPU", *gpu))
    for key, title, head, figs in figure_sections:
        parts = [head] + [_figure_html(fig, f"{key}-plot{i}") for i, fig in enumerate(figs)]
        sections.append((key, title, "\n".join(p for p in parts if p) or "<p class='muted'>No data.</p>"))
    sections.append(("timeline", "Timeline", _timeline(run, timeline_cap)))
    sections.append(("metadata", "Run metadata", _metadata(run, summary)))
    nav = " ".join(f'<a href="#{k}">{_esc(t)}</a>' for k, t, _ in sections)
    body = "\n".join(f'<section id="{k}"><h2>{_esc(t)}</h2>{content}</section>' for k, t, content in sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>stepscope: {_esc(run.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>stepscope report: {_esc(run.name)}</h1>"
            f"<nav>{nav}</nav>{body}<script>{_plotly_js()}</script><script>{PLOT_LOADER}</script></body></html>")


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def write_report(run: Run, out: Optional[str] = None, params: Optional[dict] = None,
                 timeline_cap: int = DETAIL_CAP) -> str:
    out = out or os.path.join(run.path, REPORT_FILE)
    text = render(run, params, timeline_cap)
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    return out
