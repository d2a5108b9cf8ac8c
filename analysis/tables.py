"""Derived tables: steps and phases from the events table (plain functions over DataFrames).

* ``steps``: one row per step (SPEC §3): process, pid, rank, mode, step,
  start_ns, end_ns, duration_ns, the five phases' exclusive time in the
  step, and Other (the step's time outside every phase).
* ``phases``: one row per phase span, attributed by time to the step it
  starts in, with its exclusive time (a phase minus the phases nested in it,
  as Forward/Backward inside an LBFGS Optimizer step).
GPU tables (kernels, memcpy, memset, sync, cuda_api) are in ``gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PHASES = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
STEP_COLUMNS = ["process", "pid", "rank", "mode", "step", "start_ns", "end_ns", "duration_ns", *PHASES, "Other"]
PHASE_COLUMNS = ["process", "pid", "rank", "tid", "mode", "step", "name", "start_ns", "end_ns", "duration_ns",
                 "exclusive_ns"]
from stepscope.analysis.gpu import KERNEL_COLUMNS  # noqa: F401,E402 - the kernels table's columns


def _bare_steps(events: pd.DataFrame) -> pd.DataFrame:
    """Step rows from the step marks: each step runs to the next mark of its process."""
    marks = events[(events["category"] == "step") & (events["kind"] == "instant")]
    if marks.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS[:8]})
    last_end = events.groupby("process", observed=True)["end_ns"].max()
    parts = []
    for process, m in marks.groupby("process", observed=True, sort=True):
        order = np.argsort(m["start_ns"].to_numpy(), kind="stable")
        m = m.iloc[order]
        times = m["start_ns"].to_numpy()
        names = m["name"]
        ends = np.append(times[1:], int(last_end[process]))
        keep = (names != "end").to_numpy()
        parts.append(pd.DataFrame({
            "process": process, "pid": m["pid"].to_numpy()[keep], "rank": m["rank"].to_numpy()[keep],
            "mode": names.to_numpy()[keep], "step": m["arg"].to_numpy()[keep], "start_ns": times[keep],
            "end_ns": ends[keep]}))
    steps = pd.concat(parts, ignore_index=True)
    steps["mode"] = steps["mode"].astype(str).astype("category")
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    steps["rank"] = steps["rank"].astype("Int64")
    return steps


def exclusive_durations(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each span's time minus the spans nested in it on the same thread."""
    dur = end - start
    if len(dur) < 2:
        return dur
    same = tid[1:] == tid[:-1]
    if np.all(~same | (start[1:] >= start[:-1])) and not np.any(same & (start[1:] < end[:-1])):
        return dur  # already in order and nothing nests: the common case, no sort, no loop
    order = np.lexsort((start - end, start, tid))  # per thread, parents first
    s, e, t = start[order], end[order], tid[order]
    if not np.any((t[1:] == t[:-1]) & (s[1:] < e[:-1])):
        return dur
    excl = (e - s).copy()
    stack = []
    for i in range(len(s)):
        while stack and (t[stack[-1]] != t[i] or s[i] >= e[stack[-1]]):
            stack.pop()
        if stack:
            parent = stack[-1]
            excl[parent] -= min(e[i], e[parent]) - s[i]
        stack.append(i)
    out = np.empty_like(excl)
    out[order] = excl
    return out


def _attribute(steps: pd.DataFrame, process: str, starts: np.ndarray) -> np.ndarray:
    """Row labels of the steps (of one process) that contain each start time, or -1."""
    s = steps[steps["process"] == process]
    if s.empty:
        return np.full(len(starts), -1)
    order = np.argsort(s["start_ns"].to_numpy(), kind="stable")
    s_start = s["start_ns"].to_numpy()[order]
    s_end = s["end_ns"].to_numpy()[order]
    labels = s.index.to_numpy()[order]
    where = np.searchsorted(s_start, starts, side="right") - 1
    ok = (where >= 0) & (starts < s_end[np.clip(where, 0, None)])
    return np.where(ok, labels[np.clip(where, 0, None)], -1)


def phases_frame(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Phase spans, each attributed to the step it starts in (by time, per process)."""
    rows = np.flatnonzero(((events["category"] == "phase") & (events["kind"] == "span")).to_numpy())
    if not len(rows):
        return pd.DataFrame({c: [] for c in PHASE_COLUMNS + ["_step_row"]})
    col = {c: events[c].to_numpy()[rows] for c in ("pid", "tid", "start_ns", "end_ns", "duration_ns")}
    names = events["name"].iloc[rows].cat.remove_unused_categories()
    processes = events["process"].iloc[rows]
    counted_codes = [i for i, c in enumerate(names.cat.categories) if c in PHASES]
    codes = names.cat.codes.to_numpy()
    labels = np.full(len(rows), -1, dtype=np.int64)
    excl = col["end_ns"] - col["start_ns"]
    process_codes = processes.cat.codes.to_numpy()
    for code, process in enumerate(processes.cat.categories):
        mine = np.flatnonzero(process_codes == code)
        if not len(mine):
            continue
        labels[mine] = _attribute(steps, process, col["start_ns"][mine])
        counted = mine[np.isin(codes[mine], counted_codes)]
        # Recompute stays inside Backward's time: only the five phases nest here.
        excl[counted] = exclusive_durations(col["start_ns"][counted], col["end_ns"][counted], col["tid"][counted])
    has = labels >= 0
    safe = np.where(has, labels, 0)
    if len(steps):
        step_mode = steps["mode"].astype("category")
        mode = pd.Categorical.from_codes(np.where(has, step_mode.cat.codes.to_numpy()[safe], -1),
                                         step_mode.cat.categories)
        step = np.where(has, steps["step"].to_numpy()[safe], -1).astype(np.int64)
    else:
        mode = pd.Categorical.from_codes(np.full(len(rows), -1), ["train"])
        step = np.full(len(rows), -1, dtype=np.int64)
    return pd.DataFrame({
        "process": processes.array, "pid": col["pid"], "rank": events["rank"].array[rows],
        "tid": col["tid"], "mode": mode, "step": step, "name": names.array,
        "start_ns": col["start_ns"], "end_ns": col["end_ns"], "duration_ns": col["duration_ns"],
        "exclusive_ns": excl, "_step_row": labels}, copy=False)


def _union_length_per_group(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """Total length of the union of intervals, per group (0..n-1), vectorized."""
    out = np.zeros(n, dtype=np.int64)
    if len(groups) == 0:
        return out
    order = np.lexsort((starts, groups))
    g, s, e = groups[order], starts[order], ends[order]
    reach = pd.Series(e).groupby(g).cummax().to_numpy()  # furthest end so far in the group
    new_block = np.ones(len(g), dtype=bool)
    new_block[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    block_start = s[new_block]
    block_end = np.maximum.reduceat(e, np.flatnonzero(new_block))
    np.add.at(out, g[new_block], block_end - block_start)
    return out


def steps_and_phases(events: pd.DataFrame):
    """(steps, phases): steps carry each phase's exclusive time and Other."""
    steps = _bare_steps(events)
    phases = phases_frame(events, steps)
    for name in PHASES:
        steps[name] = np.int64(0)
    steps["Other"] = steps["duration_ns"]
    if len(phases) and len(steps):
        row = phases["_step_row"].to_numpy()
        inside = row >= 0
        excl = phases["exclusive_ns"].to_numpy()
        for name in PHASES:
            sel = inside & (phases["name"] == name).to_numpy()
            steps[name] = np.bincount(row[sel], weights=excl[sel], minlength=len(steps)).astype(np.int64)
        covered = _union_length_per_group(row[inside], phases["start_ns"].to_numpy()[inside],
                                          phases["end_ns"].to_numpy()[inside], len(steps))
        steps["Other"] = np.maximum(steps["duration_ns"].to_numpy() - covered, 0)
    phases = phases.drop(columns=["_step_row"])
    return steps[STEP_COLUMNS], phases[PHASE_COLUMNS]
