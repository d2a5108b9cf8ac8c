"""The report's plots: plotly figures of bounded size, and the partial plotly.js that draws them.

A report must stay small whatever the run's length, so every figure here has
a fixed ceiling of points: step plots show means of consecutive steps beyond
``STEP_POINTS`` (outliers stay individual), time series means of consecutive
samples beyond ``SERIES_POINTS``, the per-core heatmap at most ``HEAT_CELLS``
cells. Values are rounded to what a plot can show, times are seconds after
the run's first event (the timeline's origin), and the figure template is
sent once for all figures.

Only the trace types used here and in report_sections.py (scatter, bar, heatmap, pie, box) are needed, so the
page inlines plotly.js's "cartesian" bundle (``plotly-cartesian.min.js``, from
npm's ``plotly.js-cartesian-dist-min``, MIT, ``plotly-LICENSE.txt``: 1.5 MB
instead of the full 4.8 MB), gzip-compressed and base64-encoded (0.66 MB); the
page inflates it with the browser's ``DecompressionStream`` before the first
plot is drawn. Nothing is fetched: the report opens offline.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import os

import numpy as np
import pandas as pd

from stepscope.analysis.gpu_activity import busy_ns, device_operations
from stepscope.analysis.store.frames import groups, split
from stepscope.core.vocabulary import OTHER, PHASES

COLORS = dict(zip((*PHASES, OTHER), ("#e45756", "#4c78a8", "#f58518", "#54a24b", "#b279a2", "#bab0ac")))
STEP_POINTS = 3000  # per figure, shared by its processes; beyond it, means of consecutive steps
BAR_POINTS = 1000  # stacked bars per figure: each is an SVG path, and 1000 already fill the plot's width
MIN_POINTS = 200  # per trace, however many processes share a figure
SERIES_POINTS = 1500  # per time series
HEAT_CELLS = 40_000  # per-core CPU heatmap
MAX_RANK_PLOTS = 16  # per-rank phase breakdown subplots
TOP_KERNELS = 15
BUNDLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plotly-cartesian.min.js")
TRACE_TYPES = ("scatter", "bar", "heatmap", "pie", "box")  # all the bundle has to draw

# Figures are drawn when scrolled near, once plotly.js is inflated, so a page with many opens at once.
PLOT_LOADER = """(function () {
  var plots = document.querySelectorAll("div.plot");
  var template = JSON.parse(document.getElementById("plot-template").textContent);
  var ready = (async function () {
    var b64 = document.getElementById("plotly-gz").textContent, bin = atob(b64), u8 = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
    var text = await new Response(new Blob([u8]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
    (0, eval)(text);  // plotly.js's UMD wrapper sets window.Plotly
  })();
  ready.catch(function (e) {
    plots.forEach(function (d) {
      d.textContent = "This browser cannot inflate the plots (" + e + "); the timeline and tables still work.";
    });
  });
  var draw = function (div) {
    if (div.dataset.drawn) return;
    div.dataset.drawn = "1";
    ready.then(function () {
      var fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
      fig.layout.template = template;
      Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
    });
  };
  if ("IntersectionObserver" in window) {
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting) { seen.unobserve(e.target); draw(e.target); } });
    }, {rootMargin: "400px"});
    plots.forEach(function (d) { seen.observe(d); });
  } else plots.forEach(draw);
  window.stepscopeDrawPlots = function () { plots.forEach(draw); };
})();"""


@functools.lru_cache(maxsize=1)
def plotly_bundle_gz_b64() -> str:
    with open(BUNDLE, "rb") as f:
        return base64.b64encode(gzip.compress(f.read(), compresslevel=9, mtime=0)).decode("ascii")


def template_json() -> dict:
    """The default plotly template's layout, sent once for every figure."""
    import plotly.io as pio

    template = pio.templates[pio.templates.default]
    return {"layout": json.loads(template.layout.to_json())}


def figure_payload(fig) -> dict:
    payload = json.loads(fig.to_json())
    payload["layout"].pop("template", None)
    return payload


def _r(values, digits=3) -> np.ndarray:
    return np.round(np.asarray(values, dtype=float), digits)


def thin(s: pd.DataFrame, columns, points: int = STEP_POINTS) -> pd.DataFrame:
    """At most `points` rows: means of consecutive rows (each group's first step number kept)."""
    if len(s) <= points:
        return s
    group = np.arange(len(s)) * points // len(s)
    out = s[list(columns)].groupby(group).mean()
    if "step" in s.columns:
        out["step"] = s["step"].to_numpy()[np.searchsorted(group, out.index)]
    return out


def thin_series(x: np.ndarray, y: np.ndarray, points: int = SERIES_POINTS):
    """At most `points` samples of a time series: means of consecutive samples."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) <= points:
        return x, y
    group = np.arange(len(x)) * points // len(x)
    first = np.flatnonzero(np.diff(group, prepend=-1))
    count = np.diff(np.append(first, len(x)))
    return np.add.reduceat(x, first) / count, np.add.reduceat(y, first) / count


def origin_ns(run) -> int:
    """The run's first event (the timeline's zero), so plots and timeline share one time axis."""
    ext = run.extents()
    starts = [int(t.min()) for t in (ext["start_ns"] if len(ext) else None,
                                     run.steps["start_ns"] if len(run.steps) else None) if t is not None]
    if not starts and len(run.system):
        starts.append(int(run.system["timestamp_ns"].min()))
    return min(starts) if starts else 0


def _step_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """What the step figures read, a new frame (no copy of a run's millions of steps): each
    step's mode, number, ms, phases, and its process as a ``label`` whose categories are
    the names sorted (so groups come in the order plain strings would give them)."""
    process = pd.Categorical(steps["process"])
    names = [str(c) for c in process.categories]
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names) + 1, dtype=np.int64)
    rank[order], rank[-1] = np.arange(len(names)), -1
    label = pd.Categorical.from_codes(rank[np.asarray(process.codes, dtype=np.int64)], [names[i] for i in order])
    out = {"mode": steps["mode"].array, "step": steps["step"].to_numpy(), "ms": steps["duration_ns"].to_numpy() / 1e6,
           "label": label}
    out.update({part: steps[part].to_numpy() for part in (*PHASES, OTHER)})
    return pd.DataFrame(out, index=steps.index, copy=False)


def step_figures(run):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if run.steps.empty:
        return []
    steps = _step_frame(run.steps)
    figs = []
    hist = go.Figure()
    for mode, s in split(steps, "mode", ["ms"], sort=True):
        counts, edges = np.histogram(s["ms"], bins=min(100, max(10, int(np.sqrt(len(s))))))
        hist.add_trace(go.Bar(x=_r((edges[:-1] + edges[1:]) / 2, 4), y=counts, width=_r(np.diff(edges), 4),
                              name=str(mode), opacity=0.75))
    hist.update_layout(title="Step time distribution", xaxis_title="ms", yaxis_title="steps", barmode="overlay")
    figs.append(hist)

    over = go.Figure()
    keyed = steps.dropna(subset=["label", "mode"])  # (as pandas' group-by leaves them out)
    by_label = groups(keyed, ["label", "mode"])  # (each process's steps a slice, not copied)
    points = max(MIN_POINTS, STEP_POINTS // max(len(by_label), 1))
    for (label, mode), s in by_label:
        med = s["ms"].median()
        outlier = s["ms"] > 2 * med
        shown = thin(s, ["ms", "step"], points)
        over.add_trace(go.Scatter(x=shown["step"], y=_r(shown["ms"]), mode="markers", name=f"{label} {mode}"
                                  + (" (means of consecutive steps)" if len(shown) < len(s) else ""),
                                  marker={"size": 4}))
        if outlier.sum() > points:
            outlier &= s["ms"] >= s["ms"][outlier].nlargest(points).min()
        if outlier.any():
            over.add_trace(go.Scatter(x=s["step"][outlier], y=_r(s["ms"][outlier]), mode="markers",
                                      name=f"{label} {mode} outliers (> 2x median)",
                                      marker={"size": 9, "symbol": "x", "color": "#e45756"}))
    over.update_layout(title="Step time over the run", xaxis_title="step", yaxis_title="ms")
    figs.append(over)

    train = steps[steps["mode"] == "train"] if (steps["mode"] == "train").any() else steps
    every = sorted(train["label"].unique())
    labels = every[:MAX_RANK_PLOTS]
    of_label = dict(split(train, "label"))
    points = max(MIN_POINTS, BAR_POINTS // len(labels))
    stacked = make_subplots(rows=len(labels), cols=1, shared_xaxes=True, subplot_titles=labels,
                            vertical_spacing=min(0.08 if len(labels) > 1 else 0.1, 0.5 / len(labels)))
    for row, label in enumerate(labels, start=1):
        s = thin(of_label[label], [*PHASES, OTHER], points)
        for part in (*PHASES, OTHER):
            stacked.add_trace(go.Bar(x=s["step"], y=_r(s[part] / 1e6), name=part, marker_color=COLORS[part],
                                     legendgroup=part, showlegend=row == 1), row=row, col=1)
    title = "Phase breakdown per train step (per rank)"
    if len(every) > len(labels):
        title += f": the first {len(labels)} of {len(every)} processes"
    stacked.update_layout(title=title, barmode="stack", yaxis_title="ms", height=260 + 220 * len(labels))
    figs.append(stacked)
    return figs


def _heatmap(cpu: pd.DataFrame, t0: int):
    import plotly.graph_objects as go

    cores = cpu.pivot_table(index="device", columns="timestamp_ns", values="value")
    order = sorted(cores.index, key=lambda d: int(d[3:]) if d[3:].isdigit() else 0)
    cores = cores.loc[order]
    columns = max(50, min(cores.shape[1], HEAT_CELLS // max(len(cores), 1)))
    x, z = (cores.columns.to_numpy() - t0) / 1e9, cores.to_numpy()
    if cores.shape[1] > columns:  # means of consecutive samples
        group = np.arange(len(x)) * columns // len(x)
        first = np.flatnonzero(np.diff(group, prepend=-1))
        x = np.add.reduceat(x, first) / np.diff(np.append(first, len(x)))
        z = np.stack([pd.Series(row).groupby(group).mean().to_numpy() for row in z]) if len(z) else z
    heat = go.Figure(go.Heatmap(z=_r(z, 1), x=_r(x), y=list(cores.index), zmin=0, zmax=100,
                                colorscale="Viridis", colorbar={"title": "%"}))
    return heat, len(cores)


def system_figures(run, esc):
    import plotly.graph_objects as go

    system = run.system
    if system.empty:
        return []
    t0 = origin_ns(run)
    xaxis = "s after the run's first event"
    figs = []
    marks = run.steps["start_ns"].to_numpy() if len(run.steps) else np.array([])
    for node, s in system.groupby("node"):
        cpu = s[(s["metric"] == "cpu_util")]
        if not cpu.empty:
            allc = cpu[cpu["device"] == "all"]
            x, y = thin_series((allc["timestamp_ns"].to_numpy() - t0) / 1e9, allc["value"].to_numpy())
            fig = go.Figure(go.Scatter(x=_r(x), y=_r(y, 1), name="all cores", mode="lines"))
            fig.update_layout(title=f"{esc(node)}: CPU utilization (mean of cores)", yaxis_title="%",
                              yaxis_range=[0, 100], xaxis_title=xaxis)
            if 0 < len(marks) <= 200:
                for t in (marks - t0) / 1e9:
                    fig.add_vline(x=round(float(t), 4), line_width=0.5, line_color="#bbb")
            figs.append(fig)
            heat, n = _heatmap(cpu[cpu["device"] != "all"], t0)
            heat.update_layout(title=f"{esc(node)}: CPU utilization per core", height=200 + 12 * n, xaxis_title=xaxis)
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
            devices = part.groupby("device")
            points = max(MIN_POINTS, SERIES_POINTS * 4 // max(devices.ngroups, 4))
            for device, d in devices:
                x, y = thin_series((d["timestamp_ns"].to_numpy() - t0) / 1e9, d["value"].to_numpy(), points)
                fig.add_trace(go.Scatter(x=_r(x), y=np.round(y), name=str(device) or metric, mode="lines"))
            fig.update_layout(title=f"{esc(node)}: {title}", yaxis_title=unit, xaxis_title=xaxis)
            figs.append(fig)
    rss = system[system["metric"] == "proc_rss"]
    if not rss.empty:
        fig = go.Figure()
        series = rss.groupby(["process", "device"])
        points = max(MIN_POINTS, SERIES_POINTS * 4 // max(series.ngroups, 4))
        for (process, device), d in series:
            x, y = thin_series((d["timestamp_ns"].to_numpy() - t0) / 1e9, d["value"].to_numpy() / 2**20, points)
            fig.add_trace(go.Scatter(x=_r(x), y=_r(y, 1), mode="lines", name=f"{process} {device}"))
        fig.update_layout(title="Resident memory per process (and its workers)", yaxis_title="MiB", xaxis_title=xaxis)
        figs.append(fig)
    return figs


def gpu_section(run, esc):
    """SageMaker Profiler's dashboard: (summary table, figures), or None without GPU activity."""
    import plotly.graph_objects as go

    # kernels from their aggregates (a large run's kernels are never held); copies, memsets, syncs are few
    names = run.kernel_names
    if not len(names):
        return None
    ops = device_operations(run, kinds=("memcpy", "memset", "sync"))
    per_step = run.kernel_steps
    ev = run.extents()
    t0, t1 = (int(ev["start_ns"].min()), int(ev["end_ns"].max())) if len(ev) else (None, None)
    if len(ops):
        t0 = min(t0 if t0 is not None else 2**63, int(ops["start_ns"].min()))
        t1 = max(t1 if t1 is not None else 0, int(ops["end_ns"].max()))
    t0, t1 = (t0, t1) if t0 is not None else (0, 1)
    wall = max(t1 - t0, 1)
    rows = []
    for device, d in names.groupby("device", sort=True):
        busy = int(per_step.loc[per_step["device"] == device, "busy_ns"].sum())
        rows.append((f"GPU {device} computing (compute kernels running; NCCL left out)",
                     f"{busy / 1e9:.3f} s of {wall / 1e9:.3f} s ({100 * busy / wall:.1f}%), "
                     f"{int(d['kernels'].sum()):,} kernels"))
    phases = run.select_phases(columns=["start_ns", "end_ns"])
    if len(phases):
        cpu = busy_ns(phases["start_ns"].to_numpy(), phases["end_ns"].to_numpy())
        rows.append(("CPU active (inside a phase)", f"{cpu / 1e9:.3f} s ({100 * cpu / wall:.1f}%)"))
    head = "<table>" + "".join(f"<tr><th>{esc(a)}</th><td>{esc(b)}</td></tr>" for a, b in rows) + "</table>"
    figs = []
    by_name = names.groupby("name").agg(time_ms=("kernel_ns", lambda x: x.sum() / 1e6), launches=("kernels", "sum"))
    for column, title, unit, fmt in (("time_ms", "Kernel time, top 15", "ms", ",.1f"),
                                     ("launches", "Kernel launches, top 15", "launches", ",.0f")):
        top = by_name.nlargest(TOP_KERNELS, column).iloc[::-1]
        all_ = by_name[column].sum()
        fig = go.Figure(go.Bar(x=_r(top[column]), y=[esc(n if len(n) <= 60 else n[:57] + "...") for n in top.index],
                               orientation="h", hovertext=[esc(n[:500]) for n in top.index], marker_color="#4c78a8"))
        fig.update_layout(title=f"{title} (all {len(by_name)} kernels: {all_:{fmt}} {unit})", xaxis_title=unit,
                          height=220 + 22 * len(top), margin={"l": 320})
        figs.append(fig)
    prec = names.groupby(names["precision"].astype(str))["kernel_ns"].sum() / 1e6
    fig = go.Figure(go.Pie(labels=list(prec.index), values=_r(prec.to_numpy()), hole=0.4))
    fig.update_layout(title="Kernel precision (share of kernel time)")
    figs.append(fig)
    activity = pd.concat([pd.Series({"kernel": names["kernel_ns"].sum() / 1e6}),
                          ops.groupby("kind", observed=True)["duration_ns"].sum() / 1e6])
    labels = {"kernel": "kernels", "memcpy": "memcpy", "memset": "memset", "sync": "sync"}
    fig = go.Figure(go.Pie(labels=[labels.get(k, k) for k in activity.index], values=_r(activity.to_numpy()),
                           hole=0.4))
    fig.update_layout(title="GPU activity (share of time: kernels / memcpy / memset / sync)")
    figs.append(fig)
    mem = ops[ops["kind"].isin(["memcpy", "memset"])]
    if len(mem):
        m = mem.groupby("name")["duration_ns"].agg(["sum", "size"])
        fig = go.Figure(go.Bar(x=list(m.index), y=_r(m["sum"] / 1e6), text=[f"{n:,} ops" for n in m["size"]]))
        fig.update_layout(title="Memory operations (time by kind)", yaxis_title="ms")
        figs.append(fig)
    util = run.system[run.system["metric"] == "gpu_util"] if len(run.system) else run.system
    if len(util):
        origin = origin_ns(run)
        fig = go.Figure()
        series = util.groupby(["node", "device"])
        points = max(MIN_POINTS, SERIES_POINTS * 4 // max(series.ngroups, 4))
        for (node, device), d in series:
            x, y = thin_series((d["timestamp_ns"].to_numpy() - origin) / 1e9, d["value"].to_numpy(), points)
            fig.add_trace(go.Scatter(x=_r(x), y=_r(y, 1), mode="lines", name=f"{node} {device}"))
        fig.update_layout(title="GPU utilization over time", yaxis_title="%", yaxis_range=[0, 100],
                          xaxis_title="s after the run's first event")
        figs.append(fig)
    return head, figs


def communication_section(run, esc, summary: dict):
    """(head, figures) of the report's Communication section, or None for a run without
    collectives: the shares, who waited for whom, and per rank each train step split into
    exposed communication, overlapped communication and the rest of the step."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    c = summary.get("communication")
    if not c:
        return None
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    rows = [("collectives", f"{c['collectives']:,} ({c['sources']['ddp']:,} DDP buckets), "
                            f"{c['bytes'] / 1e6:,.1f} MB"),
            ("in flight", f"{pct(c['share'])} of train step time ({c['ms_per_step']:.2f} ms a step)"),
            ("exposed (the loop blocked)", f"{pct(c['exposed_share'])} ({c['exposed_ms_per_step']:.2f} ms a step)"),
            ("overlapped (hidden behind work)", pct(c["overlapped_share"]))]
    for phase, e in c["by_phase"].items():
        rows.append((f"exposed in {phase}", f"{pct(e['share'])}, waiting for {e['kind']} ({e['exposed_ms']:.1f} ms)"))
    if c.get("left_out"):
        rows.append(("not recorded", ", ".join(f"{n} {k}x" for n, k in c["left_out"]["ops"].items())
                     + ": " + c["left_out"]["note"]))
    head = "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"
    kinds = "".join(f"<tr><td>{esc(k)}</td><td>{v['count']:,}</td><td>{v['async']:,}</td>"
                    f"<td>{v['bytes'] / 1e6:,.2f}</td><td>{v['total_ms']:,.1f}</td></tr>"
                    for k, v in c["by_kind"].items())
    head += ("<h3>By kind</h3><table><tr><th>kind</th><th>count</th><th>async</th><th>MB</th>"
             f"<th>in flight (ms, summed)</th></tr>{kinds}</table>")
    if c["waited_for"]:
        waits = "".join(f"<tr><td>rank {w['rank']}</td><td>{w['last_at']:,} of {w['of']:,}</td>"
                        f"<td>{w['waited_ms']:,.1f}</td><td>{w['ms_per_step']:.2f}</td></tr>" for w in c["waited_for"])
        head += ("<h3>Who waits for whom</h3><table><tr><th>rank</th><th>arrived last at</th>"
                 f"<th>the others waited for it (ms)</th><th>per step of theirs (ms)</th></tr>{waits}</table>")
    steps = run.steps
    train = steps[steps["mode"] == "train"] if (steps["mode"] == "train").any() else steps
    train = train.assign(label=train["process"].astype(str))
    labels = sorted(train["label"].unique())[:MAX_RANK_PLOTS]
    if not labels:
        return head, []
    points = max(MIN_POINTS, BAR_POINTS // len(labels))
    fig = make_subplots(rows=len(labels), cols=1, shared_xaxes=True, subplot_titles=labels,
                        vertical_spacing=min(0.08 if len(labels) > 1 else 0.1, 0.5 / len(labels)))
    parts = (("comm_exposed_ns", "communication, exposed", "#c0392b"),
             ("comm_overlapped_ns", "communication, overlapped", "#f2a541"),
             ("rest", "rest of the step", "#bab0ac"))
    for row, label in enumerate(labels, start=1):
        s = train[train["label"] == label]
        s = s.assign(rest=s["duration_ns"] - s["comm_ns"])
        s = thin(s, ["comm_exposed_ns", "comm_overlapped_ns", "rest"], points)
        for col, name, color in parts:
            fig.add_trace(go.Bar(x=s["step"], y=_r(s[col] / 1e6), name=name, marker_color=color, legendgroup=name,
                                 showlegend=row == 1), row=row, col=1)
    fig.update_layout(title="Communication per train step (per rank)", barmode="stack", yaxis_title="ms",
                      height=260 + 220 * len(labels))
    return head, [fig]
