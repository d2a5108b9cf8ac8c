"""``stepscope export``: a run as Chrome/Perfetto traces or as Parquet tables.

* ``chrome``: Trace Event JSON in the layout PyTorch's profiler writes, one
  file per rank (``<out>/rank<N>.pt.trace.json``; processes without a rank,
  such as a single script, are rank 0; DataLoader workers go with the rank
  that started them), so chrome://tracing, Perfetto and Holistic Trace
  Analysis read it as they read PyTorch's: ``distributedInfo`` with the rank
  on a line of its own near the top (HTA finds it there), train steps as
  ``ProfilerStep#N`` ranges (``user_annotation``) with their phase
  breakdown, ``cat`` values ``user_annotation`` (phases, annotations),
  ``cpu_op`` (ops), ``python_function`` (modules), ``cuda_runtime`` (launches),
  and per GPU kernel ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` /
  ``cuda_sync`` (pid the device, tid the stream) with ``ac2g`` flow events
  from each launch to its kernel. Times are microseconds after
  ``baseTimeNanoseconds`` (the run's first event, epoch ns), the same in
  every rank's file.
* ``perfetto``: every rank in one file in Perfetto's own protobuf format
  (``<run>/<run name>.perfetto-trace``, written by ``analysis/export/perfetto.py``),
  several times smaller than gzip JSON. An output path ending in
  ``.json.gz`` gets the Chrome JSON of every rank in one gzip file instead
  (ui.perfetto.dev opens both).
* ``parquet``: every table (events, steps, phases, system, kernels, ...) as a
  Parquet file, for DuckDB, pandas, Spark and Trino; a large run's tables are
  its dataset's Hive-partitioned folders (docs/format.md), linked, not rebuilt.
* ``speedscope`` (``<run>/<run name>.speedscope.json``): the Python stack
  samples in speedscope's file format, one "sampled" profile per process and
  thread, weights in nanoseconds; ``collapsed`` (``<run name>.collapsed.txt``):
  Brendan Gregg's folded stacks (``root;...;leaf count``) for flamegraph.pl,
  inferno and speedscope, with the phase as the root frame when ``by_phase``
  (analysis/tables/samples.py).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from typing import Callable, Iterator, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.export.perfetto import write_perfetto
from stepscope.analysis.export.trace_names import CPU_CATS, GPU_CATS, step_name
from stepscope.analysis.gpu_activity import device_operations, host_launches
from stepscope.analysis.report.timeline import _merged
from stepscope.analysis.run import Run, export_parquet
from stepscope.analysis.tables import ops, stepping
from stepscope.analysis.tables import samples as pysamples
from stepscope.core import files
from stepscope.core.vocabulary import OTHER, PHASES, TRAIN

FORMATS = ("chrome", "perfetto", "parquet", "speedscope", "collapsed")


def _default_path(run: Run, fmt: str) -> str:
    names = {"chrome": "chrome", "perfetto": f"{run.name}.perfetto-trace", "parquet": "parquet",
             "speedscope": f"{run.name}.speedscope.json", "collapsed": f"{run.name}.collapsed.txt"}
    return os.path.join(run.path, names[fmt])


def _rank_of(procs: pd.DataFrame, ev: pd.DataFrame) -> dict:
    """process -> rank; helpers (workers) take their parent's, processes without one are 0."""
    ranks = {}
    for _, p in procs.iterrows():
        r = p["rank"]
        ranks[p["process"]] = int(r) if r is not None and r == r else None
    if len(ev):  # the events table carries a worker's parent rank
        first = ev.groupby("process", observed=True)["rank"].first()
        for process, r in first.items():
            if ranks.get(process) is None and not pd.isna(r):
                ranks[process] = int(r)
    return {p: (0 if r is None else r) for p, r in ranks.items()}


def _phases_ms(s) -> dict:
    return {f"{k}_ms": getattr(s, k) / 1e6 for k in (*PHASES, OTHER)}


def _events(run: Run, processes, base: int, progress=None) -> Iterator[str]:
    """JSON strings, one trace event each, for the given processes."""
    dumps = json.dumps
    procs = run.processes
    procs = procs[procs["process"].isin(processes)]
    ev = run.events
    ev = ev[ev["process"].isin(processes)] if len(ev) else ev
    step_tid = {}
    marks = ev[(ev["category"] == "step") & (ev["kind"] == "instant")] if len(ev) else ev
    for process, m in marks.groupby("process", observed=True):
        step_tid[process] = int(m["tid"].iloc[0])
    for _, p in procs.iterrows():
        rank = p["rank"]
        label = p["process"] if rank is None or rank != rank else f"{p['process']} (rank {int(rank)})"
        yield dumps({"ph": "M", "name": "process_name", "pid": int(p["pid"]), "args": {"name": label}})
    steps = run.steps
    for s in steps[steps["process"].isin(processes)].itertuples():
        name = step_name(s.mode, s.step)
        yield dumps({"ph": "X", "cat": "user_annotation", "name": name, "pid": int(s.pid),
                     "tid": step_tid.get(s.process, int(s.pid)), "ts": (s.start_ns - base) / 1e3,
                     "dur": s.duration_ns / 1e3, "args": {"step": int(s.step), "mode": str(s.mode), **_phases_ms(s)}})
    kinds = ev["kind"].cat.codes.to_numpy()  # 0 span, 1 instant, 2 counter
    cats = ev["category"].astype(str).to_numpy()
    pid, tid = ev["pid"].to_numpy(), ev["tid"].to_numpy()
    ts = (ev["start_ns"].to_numpy() - base) / 1e3
    dur = ev["duration_ns"].to_numpy() / 1e3
    step, value = ev["step"].to_numpy(), ev["value"].to_numpy()
    name_codes, name_cats = ev["name"].cat.codes.to_numpy(), ev["name"].cat.categories
    n = len(ev)
    op_args = _op_args(ev)
    for i in range(n):
        name = name_cats[name_codes[i]]
        cat = cats[i]
        if kinds[i] == 0:
            # an op's recorded step is the one its window closed in: torch's keys instead
            args = op_args.get(i, {}) if cat == "op" else {"step": int(step[i])}
            yield dumps({"ph": "X", "cat": CPU_CATS.get(cat, cat), "name": name, "pid": int(pid[i]),
                         "tid": int(tid[i]), "ts": float(ts[i]), "dur": float(dur[i]), "args": args})
        elif cat == "op":
            continue  # an op's input dims: in its span's args
        elif kinds[i] == 1:
            if cat == "step":
                continue  # the ProfilerStep ranges show them
            yield dumps({"ph": "i", "s": "t", "cat": cat, "name": name, "pid": int(pid[i]), "tid": int(tid[i]),
                         "ts": float(ts[i])})
        else:
            metric, _, device = name.partition("|")
            yield dumps({"ph": "C", "cat": cat, "name": f"{metric} {device}".strip(), "pid": int(pid[i]),
                         "ts": float(ts[i]), "args": {"value": float(value[i]) if np.isfinite(value[i]) else 0.0}})
        if progress is not None and i % 200_000 == 0:
            progress(i, n)
    yield from _gpu_events(run, processes, base)


def _op_args(ev: pd.DataFrame) -> dict:
    """Row position -> PyTorch profiler's args of an op span: "Input Dims", "Sequence number"."""
    rows = stepping._rows_of(ev, "op", "span")
    if not len(rows):
        return {}
    index, seqs, _ = ops.unpack_arg(np.maximum(ev["arg"].to_numpy()[rows], 0))
    shapes = ops._shapes(ev, ev["process"].to_numpy()[rows], index)
    parsed: dict = {}
    out = {}
    for i, seq, dims in zip(rows.tolist(), seqs.tolist(), shapes):
        a = {"Sequence number": seq} if seq >= 0 else {}
        if dims is not None:
            if dims not in parsed:
                try:
                    parsed[dims] = json.loads(dims)
                except ValueError:  # cut at its length limit
                    parsed[dims] = dims
            a["Input Dims"] = parsed[dims]
        out[i] = a
    return out


def _gpu_events(run: Run, processes, base: int) -> Iterator[str]:
    """CUDA calls on their host threads; kernels and memory operations on (device, stream)
    tracks (pid the device, tid the stream, as PyTorch writes them); ac2g flows between them."""
    ops, calls = device_operations(run), host_launches(run)
    ops, calls = ops[ops["process"].isin(processes)], calls[calls["process"].isin(processes)]
    pids = dict(zip(run.processes["process"], run.processes["pid"]))
    dumps = json.dumps
    launch_at = {}
    for c in calls.itertuples(index=False):
        pid = int(pids.get(c.process, -1))
        ts = (c.start_ns - base) / 1e3
        launch_at[(c.process, int(c.correlation))] = (pid, int(c.thread), ts)
        yield dumps({"ph": "X", "cat": "cuda_runtime", "name": c.name, "pid": pid, "tid": int(c.thread), "ts": ts,
                     "dur": (c.end_ns - c.start_ns) / 1e3, "args": {"correlation": int(c.correlation)}})
    for device in sorted(set(ops["device"].tolist())):
        yield dumps({"ph": "M", "name": "process_name", "pid": int(device), "args": {"name": f"GPU {device}"}})
    for op in ops.itertuples(index=False):
        device, stream, corr = int(op.device), int(op.stream), int(op.correlation)
        ts = (op.start_ns - base) / 1e3
        yield dumps({"ph": "X", "cat": GPU_CATS[op.kind], "name": op.name, "pid": device, "tid": stream, "ts": ts,
                     "dur": op.duration_ns / 1e3, "args": {"device": device, "stream": stream, "correlation": corr}})
        launch = launch_at.get((op.process, corr)) if corr else None
        if launch is not None:
            yield dumps({"ph": "s", "id": corr, "pid": launch[0], "tid": launch[1], "ts": launch[2], "cat": "ac2g",
                         "name": "ac2g"})
            yield dumps({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": ts, "cat": "ac2g",
                         "name": "ac2g", "bp": "e"})


def _write_trace(path: str, header: dict, events: Iterator[str], compress: bool = False) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with files.open_new(tmp, "wb") as raw, \
            (gzip.open(raw, "wt", encoding="utf-8") if compress else io.TextIOWrapper(raw, "utf-8")) as f:
        f.write("{\n")
        for key, value in header.items():  # one key a line: HTA reads the rank line by line
            f.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        f.write('  "traceEvents": [\n')
        first = True
        for line in events:
            if not first:
                f.write(",\n")
            f.write(line)
            first = False
        f.write("\n]}\n")
    os.replace(tmp, path)


def step_windows(run: Run, ranges) -> list:
    """[(start_ns, end_ns)] of the train steps in ``ranges`` ([(first, last)]), on every process."""
    steps = run.steps
    steps = steps[steps["mode"].astype(str) == TRAIN]
    mine = np.zeros(len(steps), dtype=bool)
    for lo, hi in ranges:
        mine |= ((steps["step"] >= lo) & (steps["step"] <= hi)).to_numpy()
    if not mine.any():
        raise ValueError(f"no train step in {', '.join(f'{a}-{b}' for a, b in ranges)} "
                         f"(this run's train steps: {int(steps['step'].min()) if len(steps) else 'none'}"
                         f"{'-' + str(int(steps['step'].max())) if len(steps) else ''})")
    return _merged(steps["start_ns"].to_numpy()[mine], steps["end_ns"].to_numpy()[mine])


def export(run: Run, fmt: str, out: Optional[str] = None,
           progress: Optional[Callable[[int, int], None]] = None, by_phase: bool = False,
           steps=None) -> str:
    """Writes the run in `fmt`; returns the path written (a folder for chrome and parquet).
    ``by_phase``: collapsed stacks get the phase as their root frame. ``steps``:
    [(first, last)] train steps: the chrome and perfetto traces hold only what ran
    during them (a large run is read through a time filter, never whole)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not valid; allowed: {', '.join(FORMATS)}")
    out = out or _default_path(run, fmt)
    if steps is not None:
        if fmt not in ("chrome", "perfetto"):
            raise ValueError(f"steps apply to the chrome and perfetto formats, not {fmt}")
        run = run.window(step_windows(run, steps))
    if fmt in ("speedscope", "collapsed"):
        return _write_samples(run, fmt, out, by_phase)
    if fmt == "parquet":
        return export_parquet(run, out)
    if fmt == "perfetto" and not out.endswith(".json.gz"):
        return write_perfetto(run, out, progress)
    ev = run.events
    starts = [int(ev["start_ns"].min())] if len(ev) else []
    ops = device_operations(run)
    if len(ops):
        starts.append(int(ops["start_ns"].min()))
    base = min(starts) if starts else 0
    ranks = _rank_of(run.processes, ev)
    common = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
              "traceName": run.name}
    other = {"tool": "stepscope", "run": run.name, "dropped_events": int(run.dropped_events)}
    if fmt == "perfetto":
        _write_trace(out, dict(common, otherData=other), _events(run, list(ranks), base, progress), compress=True)
        return out
    files.make_dirs(out)
    world = len(set(ranks.values()))
    for rank in sorted(set(ranks.values())):
        mine = [p for p, r in ranks.items() if r == rank]
        header = {"distributedInfo": {"rank": rank, "world_size": world}, **common, "otherData": other}
        _write_trace(os.path.join(out, f"rank{rank}.pt.trace.json"), header, _events(run, mine, base, progress))
    return out


def _write_samples(run: Run, fmt: str, out: str, by_phase: bool) -> str:
    if fmt == "collapsed":
        lines = pysamples.folded(run.samples, run.stacks, by_phase=by_phase)
        with files.open_new(out) as f:
            f.write("".join(line + "\n" for line in lines))
        return out
    with files.open_new(out) as f:
        json.dump(pysamples.speedscope(run.samples, run.stacks, run.name), f, separators=(",", ":"))
    return out
