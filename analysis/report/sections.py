"""The report's sections that SageMaker Debugger's ProfilerReport had: the rules table, system
statistics per node, data loading, and box plots per GPU (batch size, GPU memory).

Each section has a function returning its numbers (tests compare them with pandas) and one
returning its HTML. Sizes stay bounded whatever the run's length: tables have a row per rule,
per metric and device, per process; box plots carry their five numbers per box (plotly's
precomputed ``q1``/``median``/``q3``/fences), never the samples; the GetNext histogram has at
most ``GETNEXT_BINS`` bars.
"""

from __future__ import annotations

import html

import re
from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.quantities import percent
from stepscope.analysis.report.plots import _r
from stepscope.analysis.rules import RULES
from stepscope.analysis.rules.gpudata import memo
from stepscope.analysis.tables.pipeline import tfdata_stages
from stepscope.core.vocabulary import GETNEXT, LOADER_FETCH, PHASES, TRAIN

GETNEXT_BINS = 60
MAX_BOXES = 32  # workers or GPUs per box plot
QUANTILES = (0.5, 0.95, 0.99)
# per-process, cumulative or constant series say nothing as a distribution over time
SKIPPED_METRICS = re.compile(r"^proc_|_total$|^gpu_energy$|^gpu_throttle_reasons$")
CORE = re.compile(r"^cpu\d+$")
PER_CORE = "each core"


# --- rules -------------------------------------------------------------------------------
def rules_rows(summary: dict) -> list:
    """One row per rule: status (triggered / passed / not applicable), how many findings it
    gave, its parameters as used (the rule engine's, else the rules' Param defaults)."""
    used = summary.get("rules_params") or {}
    skipped = summary.get("rules_not_applicable", {})
    counts, severities, related = {}, {}, {}
    for f in summary["findings"]:
        counts[f["rule"]] = counts.get(f["rule"], 0) + 1
        severities.setdefault(f["rule"], set()).add(f["severity"])
    for f in summary.get("related_findings", []):  # fired, shown under the finding that explains it
        related.setdefault(f["rule"], set()).add((f.get("related_to") or {}).get("rule", "another finding"))
    rows = []
    by_name = {r.name: r for r in RULES}
    names = list(dict.fromkeys([*by_name, *used, *skipped, *counts]))  # custom rules too
    for name in names:
        rule = by_name.get(name)
        declared = rule.params if rule is not None else {}
        params = dict(used.get(name) or {k: p.default for k, p in declared.items()})
        units = {k: p.unit for k, p in declared.items()}
        n = counts.get(name, 0)
        status = "triggered" if n else ("related" if name in related else (
            "not applicable" if name in skipped else "passed"))
        rows.append({"rule": name, "status": status, "triggered": n, "severity": sorted(severities.get(name, ())),
                     "related_to": sorted(related.get(name, ())),
                     "params": params, "units": units, "reason": skipped.get(name, ""),
                     "about": getattr(rule, "summary", "") if rule is not None else "custom rule"})
    order = {"triggered": 0, "related": 1, "passed": 2, "not applicable": 3}
    return sorted(rows, key=lambda r: order[r["status"]])


def _param_text(value, unit) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text + (f" {unit}" if unit and unit != "ratio" else "")


def rules_html(summary: dict, esc) -> str:
    rows = rules_rows(summary)
    n = {s: sum(r["status"] == s for r in rows) for s in ("triggered", "related", "passed", "not applicable")}
    related = f"{n['related']} explained by another finding, " if n["related"] else ""
    head = (f"<p>{len(rows)} rules: {n['triggered']} triggered, {related}{n['passed']} passed, {n['not applicable']} "
            "not applicable to this run. Change a parameter with <code>--param Rule.param=value</code>.</p>")
    out = []
    for r in rows:
        status = r["status"] + (f" ({r['triggered']}x, {', '.join(r['severity'])})" if r["triggered"] else "")
        if r["related_to"]:
            status = "triggered, explained by " + ", ".join(r["related_to"])
        if r["reason"]:
            status += f": {r['reason']}"
        params = ", ".join(f"{k}={_param_text(v, r['units'].get(k, ''))}" for k, v in r["params"].items())
        out.append(f'<tr class="rule {esc(r["status"].replace(" ", "-"))}" data-rule="{esc(r["rule"])}" '
                   f'data-triggered="{r["triggered"]}"><td><b>{esc(r["rule"])}</b><br><span class="muted">'
                   f'{esc(r["about"])}</span></td><td>{esc(status)}</td><td class="params">{esc(params)}</td></tr>')
    return (head + "<table class='grid rules'><tr><th>rule</th><th>result</th><th>parameters as used</th></tr>"
            + "".join(out) + "</table>")


# --- system statistics ---------------------------------------------------------------------
def system_stats(system: pd.DataFrame) -> pd.DataFrame:
    """Per node, metric and device: samples, p50, p95, p99, min, max (Debugger's
    OverallSystemUsage). Node metrics only (proc_* are per process); per-core CPU
    series are pooled into one row (device ``each core``); totals and cumulative
    counters (``*_total``, ``gpu_energy``) and the throttle bitmask are left out."""
    cols = ["node", "metric", "device", "unit", "samples", "p50", "p95", "p99", "min", "max"]
    if system.empty:
        return pd.DataFrame(columns=cols)
    s = system[~system["metric"].astype(str).str.contains(SKIPPED_METRICS)].dropna(subset=["value"])
    device = s["device"].astype(str)
    device = device.where(~(s["metric"].astype(str).str.startswith("cpu_") & device.str.match(CORE)), PER_CORE)
    g = s.assign(device=device).groupby(["node", "metric", "device", "unit"], observed=True, sort=True)["value"]
    q = g.quantile(list(QUANTILES)).unstack()
    q.columns = ["p50", "p95", "p99"]
    out = pd.concat([g.size().rename("samples"), q, g.min().rename("min"), g.max().rename("max")], axis=1)
    return out.reset_index()[cols]


UNIT_SCALE = {"bytes": (2**30, "GiB"), "bytes/s": (2**20, "MiB/s")}


def system_stats_html(system: pd.DataFrame, esc) -> str:
    stats = system_stats(system)
    if stats.empty:
        return ""
    out = []
    for node, t in stats.groupby("node", sort=True):
        rows = []
        for r in t.itertuples(index=False):
            scale, unit = UNIT_SCALE.get(r.unit, (1, r.unit))
            cells = "".join(f"<td>{getattr(r, c) / scale:,.2f}</td>" for c in ("p50", "p95", "p99", "min", "max"))
            rows.append(f'<tr data-metric="{esc(r.metric)}" data-device="{esc(r.device)}"><td>{esc(r.metric)}</td>'
                        f"<td>{esc(r.device)}</td><td>{esc(unit)}</td>{cells}<td>{r.samples:,}</td></tr>")
        out.append(f"<h3>{esc(node)}: system statistics</h3><table class='grid sysstats' data-node='{esc(node)}'>"
                   "<tr><th>metric</th><th>device</th><th>unit</th><th>p50</th><th>p95</th><th>p99</th><th>min</th>"
                   "<th>max</th><th>samples</th></tr>" + "".join(rows) + "</table>")
    return "".join(out)


# --- data loading ----------------------------------------------------------------------------
def loader_workers(run) -> pd.DataFrame:
    """Per node: CPU cores (the sampler's per-core series), training processes (with steps),
    and the most child processes of a training process alive at once (DataLoader
    workers: the sampler's ``pid<N>`` series), with workers per core."""
    system, procs = run.system, run.processes
    nodes = sorted(set(system["node"].dropna().astype(str))) if len(system) else []
    steps = run.steps
    trainers = {str(q) for q in steps["process"].unique()} if len(steps) else set()  # not 1 M strings
    rows = []
    for node in nodes:
        s = system[system["node"].astype(str) == node]
        cpu = s[s["metric"] == "cpu_util"]["device"].astype(str)
        cores = int(cpu.str.match(CORE).groupby(cpu).any().sum()) if len(cpu) else 0
        host = procs[procs["host"].astype(str) == node] if len(procs) else procs
        training = int(host["process"].astype(str).isin(trainers).sum()) if len(host) else 0
        kids = s[(s["metric"] == "proc_rss") & s["device"].astype(str).str.match(r"^pid\d+$")]
        life = kids.groupby(["process", "device"], observed=True)["timestamp_ns"].agg(["min", "max"])
        t = np.concatenate([life["min"].to_numpy(), life["max"].to_numpy()])
        d = np.concatenate([np.ones(len(life), np.int64), -np.ones(len(life), np.int64)])
        most = int(np.cumsum(d[np.lexsort((-d, t))]).max()) if len(life) else 0  # a start before an end at one instant
        rows.append({"node": node, "cores": cores, "training_processes": training, "workers": most,
                     "workers_per_core": round(most / cores, 2) if cores else None})
    return pd.DataFrame(rows, columns=["node", "cores", "training_processes", "workers", "workers_per_core"])


def _train_getnext(run) -> pd.DataFrame:
    """The train steps' GetNext phases (process, duration_ns), read once for the section's
    table and histogram (a scan of a large run's tens of millions of phases)."""
    return memo(run, "train_getnext",
                lambda: run.select_phases(names=[GETNEXT], modes=[TRAIN], columns=["process", "duration_ns"]))


def getnext_stats(run) -> pd.DataFrame:
    """Per process, its train steps' GetNext durations in ms: count, p50, p95, p99, max."""
    g = _train_getnext(run)
    cols = ["process", "count", "p50", "p95", "p99", "max"]
    if g.empty:
        return pd.DataFrame(columns=cols)
    ms = (g["duration_ns"] / 1e6).groupby(g["process"], observed=True)
    q = ms.quantile(list(QUANTILES)).unstack()
    q.columns = ["p50", "p95", "p99"]
    out = pd.concat([ms.size().rename("count"), q, ms.max().rename("max")], axis=1).reset_index(names="process")
    out["process"] = out["process"].astype(str)
    return out.sort_values("process", kind="stable")[cols].reset_index(drop=True)


def worker_fetches(run) -> pd.DataFrame:
    """Per-worker fetch spans where an integration recorded them (``LOADER_FETCH``, whose
    ``arg`` is the worker id), durations in ms."""
    sel = run.select(kinds=["span"], names=[LOADER_FETCH], columns=["process", "start_ns", "end_ns", "arg"])
    sel = sel[sel["arg"] >= 0]
    # a worker records in its own process folder: shown under the training process that started it
    procs = run.processes
    parent = dict(zip(procs["process"].astype(str), procs["parent"])) if "parent" in procs else {}
    process = [p if not isinstance(parent.get(p), str) else parent[p] for p in sel["process"].astype(str)]
    return pd.DataFrame({"process": process, "worker": sel["arg"].to_numpy(np.int64),
                         "ms": ((sel["end_ns"] - sel["start_ns"]) / 1e6).to_numpy()})


def five_numbers(values) -> dict:
    v = np.asarray(values, dtype=float)
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"lowerfence": float(v.min()), "q1": float(q1), "median": float(med), "q3": float(q3),
            "upperfence": float(v.max()), "mean": float(v.mean())}


def box_trace(label_values: list, name: str, digits: int = 3, **style):
    """A box per (label, values) from its five numbers (whiskers min and max): the samples
    themselves never enter the page."""
    import plotly.graph_objects as go

    stats = [five_numbers(v) for _, v in label_values]
    fields = {k: [round(s[k], digits) for s in stats]
              for k in ("lowerfence", "q1", "median", "q3", "upperfence", "mean")}
    return go.Box(x=[str(label) for label, _ in label_values], name=name, boxpoints=False, **fields, **style)


MAX_STAGES = 12


def dataloading(run, esc):
    """(html head, figures): workers against cores, GetNext's distribution, per-worker fetches."""
    import plotly.graph_objects as go

    parts, figs = [], []
    w = loader_workers(run)
    if len(w):
        rows = "".join(f"<tr data-node='{esc(r.node)}'><td>{esc(r.node)}</td><td>{r.cores}</td>"
                       f"<td>{r.training_processes}</td><td>{r.workers}</td>"
                       f"<td>{'' if r.workers_per_core is None else r.workers_per_core}</td></tr>"
                       for r in w.itertuples(index=False))
        parts.append("<table class='grid loaders'><tr><th>node</th><th>CPU cores</th><th>training processes</th>"
                     "<th>loader workers (most alive at once)</th><th>workers per core</th></tr>" + rows + "</table>"
                     "<p class='muted'>Loader workers are the training processes' child processes the sampler saw "
                     "(DataLoader workers). Fewer workers than cores can leave the loop waiting for batches; "
                     "many more than cores make them compete with the training process.</p>")
    g = getnext_stats(run)
    if len(g):
        rows = "".join(f"<tr data-process='{esc(r.process)}'><td>{esc(r.process)}</td><td>{r.count:,}</td>"
                       + "".join(f"<td>{getattr(r, c):,.3f}</td>" for c in ("p50", "p95", "p99", "max")) + "</tr>"
                       for r in g.itertuples(index=False))
        parts.append("<table class='grid getnext'><tr><th>process</th><th>train steps' fetches</th><th>p50 ms</th>"
                     "<th>p95 ms</th><th>p99 ms</th><th>max ms</th></tr>" + rows + "</table>")
        ms = _train_getnext(run)["duration_ns"].to_numpy() / 1e6
        counts, edges = np.histogram(ms, bins=min(GETNEXT_BINS, max(10, int(np.sqrt(len(ms))))))
        fig = go.Figure(go.Bar(x=_r((edges[:-1] + edges[1:]) / 2, 4), y=counts, width=_r(np.diff(edges), 4),
                               marker_color="#e45756"))
        fig.update_layout(title="GetNext: time the loop waited for each batch (train steps)", xaxis_title="ms",
                          yaxis_title="fetches", yaxis_type="log" if counts.max() > 100 * max(np.median(counts), 1)
                          else "linear")
        figs.append(fig)
    fetch = worker_fetches(run)
    if len(fetch):
        groups = list(fetch.groupby(["process", "worker"], sort=True)["ms"])[:MAX_BOXES]
        fig = go.Figure(box_trace([(f"{p} worker {k}", v) for (p, k), v in groups], "fetch time",
                                  marker_color="#f58518"))
        fig.update_layout(title="Fetch time per loader worker (whiskers: min and max)", yaxis_title="ms")
        figs.append(fig)
        medians = fetch.groupby(["process", "worker"])["ms"].median()
        if len(medians) > 1 and medians.min() > 0 and medians.max() >= 3 * medians.min():
            (proc, worker), slow = medians.idxmax(), medians.max()
            parts.append(f"<p class='slow-worker'>The slowest worker: {html.escape(str(proc))} worker {int(worker)}, "
                         f"{slow:.1f} ms a batch (median), {slow / medians.min():.0f}x the fastest.</p>")
    stages = tfdata_stages(run)
    if len(stages):
        rows = "".join(f"<tr data-stage='{esc(r.stage)}'><td>{esc(r.process)}</td>"
                       f"<td title='{esc(r.path)}'>{esc(r.stage)}</td><td>{r.calls:,}</td><td>{r.self_ms:,.3f}</td>"
                       f"<td>{r.self_ms_per_call:,.3f}</td><td>{r.total_ms:,.3f}</td></tr>"
                       for r in stages.groupby("process", sort=False).head(MAX_STAGES).itertuples(index=False))
        parts.append("<h3>tf.data pipeline stages (sampled steps)</h3><table class='grid tfdata'><tr><th>process</th>"
                     "<th>stage</th><th>calls</th><th>self ms</th><th>self ms per call</th><th>total ms</th></tr>"
                     + rows + "</table><p class='muted'>tf.data's own per-iterator timing in the sampled profiler "
                     "windows; a stage's self time is its work, or its wait for the stages it reads from "
                     "without the time those take (a parallel map waits for its workers). The stage with the "
                     "most self time is the one to speed up: more <code>num_parallel_calls</code>, "
                     "<code>cache()</code> before it, a larger <code>prefetch</code> after it.</p>")
    if not parts and not figs:
        return None
    if fetch.empty and stages.empty:
        parts.append("<p class='muted'>Per-worker fetch times were not recorded in this run.</p>")
    return "".join(parts), figs


# --- GPU box plots -------------------------------------------------------------------------
def gpu_series(system: pd.DataFrame) -> dict:
    """(node, device) -> {metric: values} for NVML's utilization and memory, and the node's CPU."""
    if system.empty:
        return {}
    g = system[system["metric"].isin(["gpu_util", "gpu_memory_used_percent", "gpu_memory_used"])].dropna(
        subset=["value"])
    out = {}
    for (node, device, metric), v in g.groupby(["node", "device", "metric"], observed=True, sort=True)["value"]:
        out.setdefault((str(node), str(device)), {})[metric] = v.to_numpy()
    cpu = system[(system["metric"] == "cpu_util") & (system["device"] == "all")].dropna(subset=["value"])
    for (node, _), d in out.items():
        d["cpu_util"] = cpu[cpu["node"].astype(str) == node]["value"].to_numpy()
    return dict(list(out.items())[:MAX_BOXES])


def gpu_boxes(run):
    """Box plots per GPU, or [] without NVML samples: the BatchSize rule's view (GPU and CPU
    utilization, GPU memory used), and GPU memory used over the run."""
    import plotly.graph_objects as go

    series = gpu_series(run.system)
    if not series:
        return []
    label = {k: f"{k[0]} {k[1]}" if len({n for n, _ in series}) > 1 else k[1] for k in series}
    batch = go.Figure()
    for metric, name, color in (("gpu_util", "GPU utilization", "#4c78a8"),
                                ("gpu_memory_used_percent", "GPU memory used", "#54a24b"),
                                ("cpu_util", "CPU utilization (the GPU's node, all cores)", "#f58518")):
        have = [(label[k], d[metric]) for k, d in series.items() if len(d.get(metric, ()))]
        if have:
            batch.add_trace(box_trace(have, name, 1, marker_color=color))
    batch.update_layout(title="Batch size: utilization per GPU (low GPU use with memory to spare: a larger batch "
                              "may fit; whiskers: min and max)", yaxis_title="%", yaxis_range=[0, 100],
                        boxmode="group")
    memory = go.Figure()
    have = [(label[k], d["gpu_memory_used"] / 2**30) for k, d in series.items() if len(d.get("gpu_memory_used", ()))]
    if have:
        memory.add_trace(box_trace(have, "GPU memory used", 3, marker_color="#54a24b"))
        memory.update_layout(title="GPU memory used per GPU (whiskers: min and max)", yaxis_title="GiB")
    return [f for f in (batch, memory) if f.data]


# --- operators (operator windows, analysis/tables/ops.py) ---------------------------------------------
def operators_html(run, esc, top: int = 10, windows: Optional[dict] = None) -> str:
    """Per phase, the operators with the most self time in the sampled steps; empty
    when the run has no operator windows. ``windows``: the summary's
    ``profiler_windows`` (what opening and closing them cost)."""
    ops = run.ops
    if not len(ops):
        return ""
    table = run.op_summary(top=top)
    steps = int(table["steps"].max()) if len(table) else 0
    out = [f"<p class='muted'>Operators of the {steps} sampled step(s) (the framework's profiler in short "
           "windows); self time excludes nested operators; share is of the phase's time in those steps "
           "(operators that run on several threads at once, as TensorFlow's do, can add up above 100%).</p>"]
    cost = windows
    if cost is not None:
        out.append(f"<p class='muted'>Opening and closing the {cost['windows']} PyTorch window(s) (starting torch's "
                   f"profiler, reading and writing their operators) took {cost['total_ms']:,.1f} ms, "
                   f"{percent(cost['share'])} of the time of all steps: "
                   "stepscope's cost, counted in Other, not in the phase it interrupted "
                   "(<code>STEPSCOPE_OPS=0</code> turns the windows off).</p>")
    order = {p: i for i, p in enumerate((*PHASES, "Other"))}
    for phase, t in sorted(table.groupby("phase", sort=False), key=lambda kv: order.get(kv[0], 99)):
        rows = "".join(
            f"<tr><td>{esc(r.name)}</td><td>{r.count / max(r.steps, 1):,.1f}</td>"
            f"<td>{r.self_ns_per_step / 1e6:,.3f}</td><td>{r.total_ns / max(r.steps, 1) / 1e6:,.3f}</td>"
            f"<td>{'' if r.share != r.share else f'{100 * r.share:.1f}%'}</td></tr>"
            for r in t.itertuples(index=False))
        out.append(f"<h3>{esc(phase)}: top operators</h3><table class='grid ops' data-phase='{esc(phase)}'>"
                   "<tr><th>operator</th><th>calls/step</th><th>self ms/step</th><th>total ms/step</th>"
                   "<th>share of phase</th></tr>" + rows + "</table>")
    return "".join(out)
