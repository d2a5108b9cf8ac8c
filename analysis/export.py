"""``stepscope export``: a run as a Chrome/Perfetto trace or as Parquet tables.

* ``chrome``: the Trace Event JSON format that chrome://tracing, Perfetto
  (ui.perfetto.dev opens it directly) and HTA read. Spans become complete
  events (``ph: X``), instants ``i``, counters ``C``; steps get a track of
  their own per process (``steps``), so "what ran in step 12" is one click.
  Times are microseconds since the run's first event.
* ``perfetto``: the same trace, gzip-compressed (Perfetto loads ``.json.gz``);
  smaller for large runs.
* ``parquet``: every table (events, steps, phases, system, kernels) as a
  Parquet file, for DuckDB, pandas, Spark and Trino.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Callable, Optional

import numpy as np

from stepscope.analysis.run import Run, export_parquet

FORMATS = ("chrome", "perfetto", "parquet")
STEPS_TID = 0  # the steps track of each process


def _default_path(run: Run, fmt: str) -> str:
    return os.path.join(run.path, {"chrome": "trace.json", "perfetto": "trace.json.gz",
                                   "parquet": "parquet"}[fmt])


def _chrome_events(run: Run, progress: Optional[Callable[[int, int], None]] = None):
    """Yields JSON strings, one trace event each."""
    ev = run.events
    base = int(ev["start_ns"].min()) if len(ev) else 0
    dumps = json.dumps
    procs = run.processes
    pid_of = dict(zip(procs["process"], procs["pid"]))
    for _, p in procs.iterrows():
        label = p["process"] if p["rank"] is None or p["rank"] != p["rank"] else f"{p['process']} (rank {int(p['rank'])})"
        yield dumps({"ph": "M", "name": "process_name", "pid": int(p["pid"]), "args": {"name": label}})
        yield dumps({"ph": "M", "name": "thread_name", "pid": int(p["pid"]), "tid": STEPS_TID,
                     "args": {"name": "steps"}})
    for s in run.steps.itertuples():
        yield dumps({"ph": "X", "cat": "step", "name": f"{s.mode} step {s.step}", "pid": int(pid_of.get(s.process, s.pid)),
                     "tid": STEPS_TID, "ts": (s.start_ns - base) / 1e3, "dur": s.duration_ns / 1e3,
                     "args": {"GetNext_ms": s.GetNext / 1e6, "Forward_ms": s.Forward / 1e6, "Loss_ms": s.Loss / 1e6,
                              "Backward_ms": s.Backward / 1e6, "Optimizer_ms": s.Optimizer / 1e6,
                              "Other_ms": s.Other / 1e6}})
    kinds = ev["kind"].cat.codes.to_numpy()  # 0 span, 1 instant, 2 counter
    names = ev["name"].astype(str).to_numpy() if len(ev) < 5_000_000 else None
    cats = ev["category"].astype(str).to_numpy()
    pid, tid = ev["pid"].to_numpy(), ev["tid"].to_numpy()
    ts = (ev["start_ns"].to_numpy() - base) / 1e3
    dur = ev["duration_ns"].to_numpy() / 1e3
    step, value = ev["step"].to_numpy(), ev["value"].to_numpy()
    name_codes, name_cats = ev["name"].cat.codes.to_numpy(), ev["name"].cat.categories
    n = len(ev)
    for i in range(n):
        name = names[i] if names is not None else name_cats[name_codes[i]]
        if kinds[i] == 0:
            yield dumps({"ph": "X", "cat": cats[i], "name": name, "pid": int(pid[i]), "tid": int(tid[i]),
                         "ts": float(ts[i]), "dur": float(dur[i]), "args": {"step": int(step[i])}})
        elif kinds[i] == 1:
            if cats[i] == "step":
                continue  # the steps track shows them
            yield dumps({"ph": "i", "s": "t", "cat": cats[i], "name": name, "pid": int(pid[i]), "tid": int(tid[i]),
                         "ts": float(ts[i])})
        else:
            metric, _, device = name.partition("|")
            label = f"{metric} {device}".strip()
            yield dumps({"ph": "C", "cat": cats[i], "name": label, "pid": int(pid[i]), "ts": float(ts[i]),
                         "args": {"value": float(value[i]) if np.isfinite(value[i]) else 0.0}})
        if progress is not None and i % 200_000 == 0:
            progress(i, n)


def export(run: Run, fmt: str, out: Optional[str] = None, progress=None) -> str:
    """Writes the run in `fmt`; returns the path written."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not valid; allowed: {', '.join(FORMATS)}")
    out = out or _default_path(run, fmt)
    if fmt == "parquet":
        return export_parquet(run, out)
    opener = gzip.open if fmt == "perfetto" else open
    tmp = f"{out}.tmp{os.getpid()}"
    with opener(tmp, "wt", encoding="utf-8") as f:
        f.write('{"displayTimeUnit":"ms","otherData":')
        f.write(json.dumps({"run": run.name, "tool": "stepscope", "dropped_events": int(run.dropped_events)}))
        f.write(',"traceEvents":[\n')
        first = True
        for line in _chrome_events(run, progress):
            if not first:
                f.write(",\n")
            f.write(line)
            first = False
        f.write("\n]}\n")
    os.replace(tmp, out)
    return out
