"""Operator tables: the ``op`` spans of the sampled steps (plain functions over DataFrames).

* ``ops_frame``: one row per operator event: process, pid, rank, tid, mode,
  step, phase (the innermost phase running at its start, ``Other`` outside
  every phase), name, start/end/duration, self time (its time minus the ops
  nested in it on its thread, as torch's profiler counts "self CPU"), input
  shapes (torch's "Input Dims", a string) and sequence number (-1: none; a
  backward op carries its forward op's number).
* ``op_summary``: per phase and operator over the sampled steps with ops in
  that phase: count, self and total time, self time per step, and the share
  of the phase's time in those steps (self time / the phase's exclusive time).
* ``kernel_ops``: each GPU kernel's launching operator (checked on a run
  recorded on an H200: tests/test_gpu_fixtures.py).

On disk (docs/format.md "Operator spans"): an op span's argument packs the
sequence number + 1 (bits 0-31) and the op's index in its process (bits
32-62); an op counter named by the input dims carries the same index.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.tables import gpu, stepping
from stepscope.analysis.store.schema import OP_COLUMNS
from stepscope.core.vocabulary import OP_INDEX_MASK, OP_PHASES, OTHER, PHASES

SUMMARY_COLUMNS = ["phase", "name", "count", "self_ns", "total_ns", "self_ns_per_step", "share", "steps"]


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object" if c in ("process", "mode", "phase", "name", "shapes")
                                      else "int64") for c in columns})


def _rows(events: pd.DataFrame, category: str, kind: str) -> np.ndarray:
    if isinstance(events["category"].dtype, pd.CategoricalDtype) and isinstance(events["kind"].dtype,
                                                                                 pd.CategoricalDtype):
        return stepping._rows_of(events, category, kind)
    return np.flatnonzero((events["category"].astype(str) == category).to_numpy()
                          & (events["kind"].astype(str) == kind).to_numpy())


def ops_frame(events: pd.DataFrame, steps: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """``events``: the run's events, or only its ``op`` ones (``Run.select``)."""
    rows = _rows(events, "op", "span")
    if not len(rows):
        return _empty(OP_COLUMNS)
    process = events["process"].to_numpy()[rows]
    tid = events["tid"].to_numpy()[rows]
    start, end = events["start_ns"].to_numpy()[rows], events["end_ns"].to_numpy()[rows]
    arg = events["arg"].to_numpy()[rows]
    arg = np.where(arg < 0, 0, arg)
    index, seq, hint = unpack_arg(arg)
    self_ns = np.empty(len(rows), dtype=np.int64)
    codes = pd.factorize(process)[0]
    for code in np.unique(codes):
        mine = np.flatnonzero(codes == code)
        self_ns[mine] = stepping.exclusive_durations(start[mine], end[mine], tid[mine])
    mode, step, phase = gpu.attribute(process, start, steps, phases)
    phase = np.where(pd.isna(phase), OTHER, phase)
    if hint.any():  # the phase the framework placed the op in (TensorFlow's name scopes), not its time's
        phase = np.where(hint > 0, np.array(("", *OP_PHASES), dtype=object)[hint], phase)
    out = pd.DataFrame({
        "process": process, "pid": events["pid"].to_numpy()[rows], "rank": events["rank"].array[rows],
        "tid": tid, "mode": mode, "step": step, "phase": phase,
        "name": events["name"].iloc[rows].astype(str).to_numpy(),
        "start_ns": start, "end_ns": end, "duration_ns": end - start, "self_ns": self_ns,
        "shapes": _shapes(events, process, index), "sequence_nr": seq})
    return out[OP_COLUMNS]


def unpack_arg(arg: np.ndarray):
    """An op span's argument (``vocabulary.pack_op_arg``): (index, sequence number or
    -1, phase hint: 0 none, else 1 + its place in OP_PHASES)."""
    arg = np.asarray(arg, dtype=np.int64)
    return (arg >> 32) & OP_INDEX_MASK, (arg & 0xFFFFFFFF) - 1, (arg >> 59) & 0xF


def _shapes(events: pd.DataFrame, process: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Each op's input dims, from the op counters that carry its index (None: none)."""
    out = np.full(len(index), None, dtype=object)
    rows = _rows(events, "op", "counter")
    if not len(rows):
        return out
    dims = pd.Series(events["name"].iloc[rows].astype(str).to_numpy(),
                     index=pd.MultiIndex.from_arrays([events["process"].to_numpy()[rows],
                                                      events["arg"].to_numpy()[rows]]))
    dims = dims[~dims.index.duplicated()]
    at = dims.index.get_indexer(pd.MultiIndex.from_arrays([process, index]))
    found = at >= 0
    out[found] = dims.to_numpy()[at[found]]
    return out


def op_summary(ops: pd.DataFrame, steps: pd.DataFrame, top: int = 0) -> pd.DataFrame:
    """Per phase and operator, over the sampled steps (those with ops): count, self and
    total time, self time per step, share of the phase's time; ``top``: keep that many
    operators per phase (by self time), 0 all."""
    sampled = ops[ops["step"] >= 0]
    if not len(sampled):
        return _empty(SUMMARY_COLUMNS)
    # per phase, the sampled steps that have ops in it (a window's first step has no GetNext ops:
    # the window opened after its fetch) and that phase's time in them
    keys = sampled[["process", "mode", "step", "phase"]].drop_duplicates()
    cols = [p for p in (*PHASES, OTHER) if p in steps]
    chosen = keys.merge(steps[["process", "mode", "step", *cols]], on=["process", "mode", "step"])
    phase_time, phase_steps = {}, {}
    for phase, rows in chosen.groupby("phase"):
        phase_time[phase] = int(rows[phase].sum()) if phase in rows else 0
        phase_steps[phase] = len(rows)
    agg = sampled.groupby(["phase", "name"], observed=True).agg(
        count=("self_ns", "size"), self_ns=("self_ns", "sum"), total_ns=("duration_ns", "sum")).reset_index()
    agg["steps"] = [phase_steps.get(p, 0) for p in agg["phase"]]
    agg["self_ns_per_step"] = agg["self_ns"] / agg["steps"].clip(lower=1)
    agg["share"] = [s / phase_time[p] if phase_time.get(p) else np.nan for p, s in zip(agg["phase"], agg["self_ns"])]
    agg = agg.sort_values(["phase", "self_ns"], ascending=[True, False], kind="stable", ignore_index=True)
    if top:
        agg = agg.groupby("phase", observed=True, sort=False).head(top).reset_index(drop=True)
    return agg[SUMMARY_COLUMNS]


def kernel_ops(kernels: pd.DataFrame, cuda_api: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """The kernels of the sampled steps with the operator that launched them: the innermost
    op on the launching thread running when the launch call began (``op``, ``op_index``:
    the row in ``ops``)."""
    cols = ["process", "correlation", "name", "start_ns", "duration_ns", "op", "op_index"]
    if not len(kernels) or not len(cuda_api) or not len(ops):
        return _empty(cols)
    api = cuda_api[["process", "correlation", "thread", "start_ns"]].rename(columns={"start_ns": "launch_ns"})
    k = kernels[["process", "correlation", "name", "start_ns", "duration_ns"]].merge(
        api, on=["process", "correlation"], how="inner")
    op_index = np.full(len(k), -1, dtype=np.int64)
    for (process, thread), launch in k.groupby(["process", "thread"], observed=True).groups.items():
        mine = ops[(ops["process"] == process) & (ops["tid"] == thread)]
        if not len(mine):
            continue
        seg_s, seg_e, idx = gpu._innermost_segments(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())
        pos = k.index.get_indexer(launch)
        at = gpu._lookup(seg_s, seg_e, k["launch_ns"].to_numpy()[pos])
        hit = at >= 0
        op_index[pos[hit]] = mine.index.to_numpy()[idx[at[hit]]]
    k["op_index"] = op_index
    k["op"] = np.where(op_index >= 0, ops["name"].reindex(op_index).to_numpy(), None)
    return k[k["op_index"] >= 0][cols].reset_index(drop=True)
