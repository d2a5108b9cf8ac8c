"""GPU kernels aggregated per step: what the GPU rules and the report read instead of
the kernels table, so a run of a billion kernels is judged without holding them.

Three tables, each built from one process's kernels (``analysis/tables/gpu.py``) and
written into a large run's dataset beside the kernels themselves:

* ``kernel_steps``: per (process, device, step) the *compute* kernels (NCCL left
  out: a GPU waiting in an all-reduce is not working): how many, their summed and
  median duration, the time the device was busy with them (the union of their
  intervals), the idle gaps between consecutive kernels of the step and those of
  them that waited for a launch (``LAUNCH_GAP_NS``), with their median, and the
  median launch latency.
  Beside them, the step's NCCL kernels: ``comm_kernel_ns``, the time the device ran
  one (the union of their intervals), and ``comm_exposed_kernel_ns``, the part of it
  with no compute kernel running on the device: communication the GPU waits for
  (NCCL kernels of a step without compute kernels are not counted).
* ``kernel_phases``: the same additive figures split by the phase that launched
  each kernel.
* ``kernel_names``: per (process, device, mode, name) every kernel's count and time.

Busy time and gaps are measured on each device's whole timeline (kernels in start
order): a kernel counts what it adds to the union of the kernels that started
before it, on any stream, so busy time summed over any set of steps is the union
of their kernels. A gap is counted only between two kernels of the same step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.store.schema import KERNEL_NAME_COLUMNS, KERNEL_PHASE_COLUMNS, KERNEL_STEP_COLUMNS
from stepscope.core import decoding

# An idle gap is a launch gap when the kernel after it was launched once the GPU had run dry
# (give or take the few microseconds a launch takes to reach the GPU) and the gap is short.
LAUNCH_GAP_NS = 200_000
LAUNCH_SLACK_NS = 20_000

STEP_COLUMNS, PHASE_COLUMNS, NAME_COLUMNS = KERNEL_STEP_COLUMNS, KERNEL_PHASE_COLUMNS, KERNEL_NAME_COLUMNS
_KEY = STEP_COLUMNS[:5]  # process, rank, device, mode, step
COMM_COLUMNS = ("comm_kernel_ns", "comm_exposed_kernel_ns")  # added to the pass's columns (_with_comm_kernels)
_PASS_COLUMNS = [c for c in STEP_COLUMNS if c not in COMM_COLUMNS]


def is_compute(names: pd.Series) -> np.ndarray:
    """Kernels that compute, not NCCL communication (a GPU waiting for its peers in an
    all-reduce runs a NCCL kernel the whole time, which is not work)."""
    names = names.astype("category") if not isinstance(names.dtype, pd.CategoricalDtype) else names
    nccl = names.cat.categories.astype(str).str.contains("nccl", case=False, regex=False)
    codes = names.cat.codes.to_numpy()
    return (codes >= 0) & ~np.asarray(nccl, dtype=bool)[np.clip(codes, 0, None)] if len(nccl) \
        else np.zeros(len(names), dtype=bool)


def aggregate(kernels: pd.DataFrame, max_gap_ns: float = LAUNCH_GAP_NS, native: bool = True) -> dict:
    """{"kernel_steps", "kernel_phases", "kernel_names"} of a kernels table (any number of processes).
    ``native``: the per-step figures from the native pass (csrc/aggregate/kernel_steps.cc),
    which tests hold equal to ``_steps`` here, their definition (``native=False``)."""
    steps, phases = _steps(kernels, max_gap_ns, native)
    return {"kernel_steps": _typed(_with_comm_kernels(steps, kernels), STEP_COLUMNS), "kernel_phases": phases,
            "kernel_names": names(kernels)}


def _with_comm_kernels(steps: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with each step's NCCL kernel time and its exposed part (module docstring).
    Per device: each NCCL kernel counts what it adds to the union of the NCCL kernels
    before it, and of that, what no compute kernel covers."""
    steps["comm_kernel_ns"] = np.zeros(len(steps), dtype=np.int64)
    steps["comm_exposed_kernel_ns"] = np.zeros(len(steps), dtype=np.int64)
    if not len(steps) or not len(kernels):
        return steps
    compute = is_compute(kernels["name"])
    if compute.all():
        return steps
    from stepscope.analysis.tables import comm

    k = kernels[["process", "device", "mode", "step", "start_ns", "end_ns"]]
    proc = k["process"].astype(str).to_numpy()
    device = k["device"].to_numpy(dtype=np.int64)
    start, end = k["start_ns"].to_numpy(dtype=np.int64), k["end_ns"].to_numpy(dtype=np.int64)
    sums = {}
    for (p, d), rows in pd.DataFrame({"p": proc, "d": device}).groupby(["p", "d"], sort=False).indices.items():
        nccl = rows[~compute[rows]]
        if not len(nccl):
            continue
        busy = comm.union(start[rows[compute[rows]]], end[rows[compute[rows]]])
        nccl = nccl[np.argsort(start[nccl], kind="stable")]
        s, e = start[nccl], end[nccl]
        reach = np.maximum.accumulate(e)
        lo = np.maximum(s, np.concatenate([[np.iinfo(np.int64).min], reach[:-1]]))
        added = np.clip(e - lo, 0, None)
        hi = np.maximum(e, lo)
        exposed = added - comm.measure(busy, np.minimum(lo, hi), hi)
        key = pd.DataFrame({"mode": k["mode"].astype(str).to_numpy()[nccl], "step": k["step"].to_numpy()[nccl],
                            "added": added, "exposed": np.clip(exposed, 0, None)})
        for (mode, step), g in key.groupby(["mode", "step"], sort=False):
            sums[(p, int(d), mode, int(step))] = (int(g["added"].sum()), int(g["exposed"].sum()))
    if sums:
        keys = zip(steps["process"].astype(str), steps["device"].astype(int), steps["mode"].astype(str),
                   steps["step"].astype(int))
        found = [sums.get(key, (0, 0)) for key in keys]
        steps["comm_kernel_ns"] = np.array([f[0] for f in found], dtype=np.int64)
        steps["comm_exposed_kernel_ns"] = np.array([f[1] for f in found], dtype=np.int64)
    return steps


_READS = ["process", "rank", "device", "mode", "step", "phase", "start_ns", "end_ns", "duration_ns", "launch_start_ns",
          "launch_latency_ns"]


def _steps(kernels: pd.DataFrame, max_gap_ns: float, native: bool = False):
    compute = is_compute(kernels["name"]) if len(kernels) else np.zeros(0, dtype=bool)
    if not compute.any():
        return _empty(_PASS_COLUMNS), _empty(PHASE_COLUMNS)
    k = kernels[_READS]  # (the columns read, not the whole table, when rows are left out)
    k = k if compute.all() else k[compute]
    process = k["process"].astype("category")
    pcode = process.cat.codes.to_numpy().astype(np.int64)
    device = k["device"].to_numpy(dtype=np.int64)
    start = k["start_ns"].to_numpy(dtype=np.int64)
    if pcode[0] == pcode.max() == pcode.min() and device[0] == device.max() == device.min() \
            and np.all(start[1:] >= start[:-1]):
        order = np.arange(len(start))  # one device's kernels in start order: a part of a process's trace
    else:
        order = np.lexsort((start, device, pcode))
    pcode, device, start = pcode[order], device[order], start[order]
    end = k["end_ns"].to_numpy(dtype=np.int64)[order]
    step = k["step"].to_numpy(dtype=np.int64)[order]
    same = np.zeros(len(order), dtype=bool)  # the row before is of the same (process, device)
    same[1:] = (pcode[1:] == pcode[:-1]) & (device[1:] == device[:-1])
    # the furthest end among earlier kernels of the device
    group = np.cumsum(~same)
    reach = pd.Series(end).groupby(group).cummax().to_numpy()
    prev_reach = np.empty_like(reach)
    prev_reach[0] = np.iinfo(np.int64).min
    prev_reach[1:] = reach[:-1]
    prev_reach[~same] = np.iinfo(np.int64).min
    busy = np.clip(end - np.maximum(start, prev_reach), 0, None)
    has_prev = same.copy()
    has_prev[1:] &= step[1:] == step[:-1]
    gap = np.where(has_prev, np.clip(start - prev_reach, 0, None), 0)
    launched = k["launch_start_ns"].to_numpy(dtype=float, na_value=np.nan)[order]
    if native:
        out = _native_steps(k, order, pcode, device, start, end, step, launched, process, max_gap_ns)
        if out is not None:
            return out
    waited = has_prev & (launched >= prev_reach - LAUNCH_SLACK_NS) & (gap > 0) & (gap < max_gap_ns)
    latency = k["launch_latency_ns"].to_numpy(dtype=float, na_value=np.nan)[order]
    rows = pd.DataFrame({
        "process": pd.Categorical.from_codes(pcode, categories=process.cat.categories),
        "rank": k["rank"].array.take(order), "device": device, "mode": _labels(k["mode"], order), "step": step,
        "phase": _labels(k["phase"], order), "duration": k["duration_ns"].to_numpy(dtype=np.int64)[order],
        "busy": busy, "gap": gap, "waited": waited, "launch_gap": np.where(waited, gap, 0),
        "launch_gap_or_nan": np.where(waited, gap, np.nan), "latency": latency}, copy=False)
    by = rows.groupby(_KEY, dropna=False, sort=True, observed=True)
    steps = by.agg(kernels=("duration", "size"), kernel_ns=("duration", "sum"),
                   kernel_ns_median=("duration", "median"), busy_ns=("busy", "sum"), gap_ns=("gap", "sum"),
                   launch_gaps=("waited", "sum"), launch_gap_ns=("launch_gap", "sum"),
                   launch_gap_ns_median=("launch_gap_or_nan", "median"),
                   launch_latency_ns_median=("latency", "median")).reset_index()
    phases = rows.groupby([*_KEY, "phase"], dropna=False, sort=True, observed=True).agg(
        kernels=("duration", "size"), kernel_ns=("duration", "sum"), busy_ns=("busy", "sum"),
        launch_gap_ns=("launch_gap", "sum")).reset_index()
    return _typed(steps, _PASS_COLUMNS), _typed(phases, PHASE_COLUMNS)


def _native_steps(k, order, pcode, device, start, end, step, launched, process, max_gap_ns):
    """``_steps``' two tables from the native pass; None where it does not apply (a
    process whose kernels carry more than one rank)."""
    rank = k["rank"].array.take(order)
    firsts = np.flatnonzero(np.append(True, pcode[1:] != pcode[:-1]))
    if pd.Series(rank).groupby(pcode).nunique(dropna=False).max() > 1:
        return None
    mode, phase = _labels(k["mode"], order), _labels(k["phase"], order)
    r = decoding.kernel_steps(
        process=pcode, device=device, start=start, end=end, step=step,
        mode=np.asarray(mode.codes, dtype=np.int64), phase=np.asarray(phase.codes, dtype=np.int64),
        duration=k["duration_ns"].to_numpy(dtype=np.int64)[order], launched=launched,
        latency=k["launch_latency_ns"].to_numpy(dtype=float, na_value=np.nan)[order],
        max_gap_ns=float(max_gap_ns), launch_slack_ns=LAUNCH_SLACK_NS)
    rank_of = dict(zip(pcode[firsts].tolist(), rank.take(firsts)))
    out = []
    for table, columns in ((r["steps"], _PASS_COLUMNS), (r["phases"], PHASE_COLUMNS)):
        frame = pd.DataFrame({
            "process": pd.Categorical.from_codes(table["process"], categories=process.cat.categories),
            "rank": pd.array([rank_of[p] for p in table["process"].tolist()], dtype="Int64"),
            "device": table["device"], "mode": pd.Categorical.from_codes(table["mode"], dtype=mode.dtype),
            "step": table["step"],
            **({"phase": pd.Categorical.from_codes(table["phase"], dtype=phase.dtype)} if "phase" in table else {}),
            **{c: table[c] for c in columns if c in table and c not in ("process", "device", "mode", "step", "phase")}})
        out.append(_typed(frame, columns))
    return tuple(out)


def _labels(column: pd.Series, order: np.ndarray):
    """A string column in this row order, as a categorical (grouping by codes, not strings)."""
    values = column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column)
    return values.take(order)


def combine(parts: list) -> dict:
    """The aggregates of a process's trace from those of its parts (``aggregate`` of each
    part's kernels, in trace order): counts and times add up; a step split between two
    parts keeps the medians of the part holding more of its kernels. Busy time and gaps
    are exact within a part; at a boundary the first kernels of the next part are
    measured without the kernels before them (a few kernels in 16 MB of trace)."""
    if not parts:
        return {"kernel_steps": _empty(STEP_COLUMNS), "kernel_phases": _empty(PHASE_COLUMNS),
                "kernel_names": _empty(NAME_COLUMNS)}
    if len(parts) == 1:
        return parts[0]
    out = {}
    for table, key in (("kernel_steps", _KEY), ("kernel_phases", [*_KEY, "phase"]),
                       ("kernel_names", NAME_COLUMNS[:6])):
        frame = pd.concat([p[table] for p in parts], ignore_index=True)
        columns = list(frame.columns)
        if table == "kernel_steps":  # the medians of the part with the most kernels of the step
            frame = frame.sort_values("kernels", kind="stable", ascending=False)
        sums = {c: "sum" for c in columns if c not in key and not c.endswith("_median")}
        firsts = {c: "first" for c in columns if c.endswith("_median")}
        frame = frame.groupby(key, dropna=False, sort=True, observed=True).agg({**sums, **firsts}).reset_index()
        out[table] = _typed(frame, columns)
    return out


def names(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (process, device, mode, name): count and total time of every kernel (NCCL included)."""
    if not len(kernels):
        return _empty(NAME_COLUMNS)
    k = kernels[["process", "rank", "device", "mode", "name", "precision", "duration_ns"]]
    out = k.groupby(["process", "rank", "device", "mode", "name", "precision"], dropna=False, sort=True,
                    observed=True)["duration_ns"].agg(kernels="size", kernel_ns="sum").reset_index()
    return _typed(out, NAME_COLUMNS)


_INT = ("device", "step", "kernels", "kernel_ns", "busy_ns", "gap_ns", "launch_gaps", "launch_gap_ns", "comm_kernel_ns",
        "comm_exposed_kernel_ns")


def _typed(frame: pd.DataFrame, columns) -> pd.DataFrame:
    frame = frame[columns].copy()
    for c in columns:
        if c in _INT:
            frame[c] = frame[c].astype(np.int64)
        elif c.endswith("_median"):
            frame[c] = frame[c].astype(float)
        elif c in ("mode", "phase", "name", "precision"):  # strings, missing as NA (as in the kernels table)
            frame[c] = _strings(frame[c])
    if "process" in frame:
        frame["process"] = frame["process"].astype(str).astype("category")
    if "rank" in frame:
        frame["rank"] = frame["rank"].astype("Int64")
    return frame.reset_index(drop=True)


def _strings(column: pd.Series) -> pd.Series:
    """``column.astype("str")``, a categorical's categories converted once rather than
    each row (a part's aggregates are hundreds of thousands of rows)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype("str")
    texts = pd.Index(column.cat.categories).astype("str")
    return pd.Series(texts.take(column.cat.codes.to_numpy(), allow_fill=True), index=column.index, name=column.name)


def _empty(columns) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    return _typed(frame, columns)
