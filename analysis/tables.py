"""Derived tables: steps and phases from the events table (plain functions over DataFrames).

* ``steps``: one row per step (SPEC §3): process, pid, rank, mode, step,
  start_ns, end_ns, duration_ns, the five phases' exclusive time in the
  step, and Other (the step's time outside every phase).
* ``phases``: one row per phase span, attributed by time to the step it
  starts in, with its exclusive time (a phase minus the phases nested in it,
  as Forward/Backward inside an LBFGS Optimizer step).
* ``kernels``: GPU kernels; empty until a run has GPU activity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PHASES = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
STEP_COLUMNS = ["process", "pid", "rank", "mode", "step", "start_ns", "end_ns", "duration_ns", *PHASES, "Other"]
PHASE_COLUMNS = ["process", "pid", "rank", "tid", "mode", "step", "name", "start_ns", "end_ns", "duration_ns",
                 "exclusive_ns"]
KERNEL_COLUMNS = ["process", "rank", "device", "stream", "name", "start_ns", "end_ns", "duration_ns",
                  "correlation", "step"]


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
        names = m["name"].astype(str).to_numpy()
        ends = np.append(times[1:], int(last_end[process]))
        keep = names != "end"
        parts.append(pd.DataFrame({
            "process": process, "pid": m["pid"].to_numpy()[keep], "rank": m["rank"].to_numpy()[keep],
            "mode": names[keep], "step": m["arg"].to_numpy()[keep], "start_ns": times[keep],
            "end_ns": ends[keep]}))
    steps = pd.concat(parts, ignore_index=True)
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    steps["rank"] = steps["rank"].astype("Int64")
    return steps


def exclusive_durations(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each span's time minus the spans nested in it on the same thread."""
    dur = end - start
    if len(dur) < 2:
        return dur
    order = np.lexsort((start - end, start, tid))  # per thread, parents first
    s, e, t = start[order], end[order], tid[order]
    if not np.any((t[1:] == t[:-1]) & (s[1:] < e[:-1])):
        return dur  # nothing nests: the common case, no Python loop
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
    ph = events[(events["category"] == "phase") & (events["kind"] == "span")]
    if ph.empty:
        return pd.DataFrame({c: [] for c in PHASE_COLUMNS})
    parts = []
    for process, p in ph.groupby("process", observed=True, sort=True):
        starts = p["start_ns"].to_numpy()
        label = _attribute(steps, process, starts)
        has = label >= 0
        safe = np.where(has, label, 0)
        mode = np.where(has, steps["mode"].to_numpy()[safe] if len(steps) else "", None)
        step = np.where(has, steps["step"].to_numpy()[safe] if len(steps) else -1, -1)
        counted = p["name"].isin(PHASES).to_numpy()
        excl = (p["end_ns"] - p["start_ns"]).to_numpy().copy()
        # Recompute stays inside Backward's time: only the five phases nest here.
        excl[counted] = exclusive_durations(starts[counted], p["end_ns"].to_numpy()[counted],
                                            p["tid"].to_numpy()[counted])
        parts.append(pd.DataFrame({
            "process": process, "pid": p["pid"].to_numpy(), "rank": p["rank"].to_numpy(),
            "tid": p["tid"].to_numpy(), "mode": mode, "step": step.astype(np.int64),
            "name": p["name"].astype(str).to_numpy(), "start_ns": starts, "end_ns": p["end_ns"].to_numpy(),
            "duration_ns": p["duration_ns"].to_numpy(), "exclusive_ns": excl, "_step_row": label}))
    out = pd.concat(parts, ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out


def _union_length_per_group(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> dict:
    """Total length of the union of intervals, per group."""
    out = {}
    if len(groups) == 0:
        return out
    order = np.lexsort((starts, groups))
    g, s, e = groups[order], starts[order], ends[order]
    cur_g, cur_s, cur_e, total = g[0], s[0], e[0], 0
    for k in range(1, len(g)):
        if g[k] != cur_g or s[k] > cur_e:
            total += cur_e - cur_s
            if g[k] != cur_g:
                out[int(cur_g)] = int(total)
                total = 0
            cur_g, cur_s, cur_e = g[k], s[k], e[k]
        else:
            cur_e = max(cur_e, e[k])
    out[int(cur_g)] = int(total + cur_e - cur_s)
    return out


def steps_and_phases(events: pd.DataFrame):
    """(steps, phases): steps carry each phase's exclusive time and Other."""
    steps = _bare_steps(events)
    phases = phases_frame(events, steps)
    for name in PHASES:
        steps[name] = np.int64(0)
    steps["Other"] = steps["duration_ns"]
    if len(phases) and len(steps):
        inside = phases[phases["_step_row"] >= 0]
        counted = inside[inside["name"].isin(PHASES)]
        totals = counted.groupby(["_step_row", "name"])["exclusive_ns"].sum().unstack(fill_value=0)
        for name in totals.columns:
            steps.loc[totals.index, name] = totals[name].to_numpy()
        covered = _union_length_per_group(inside["_step_row"].to_numpy(), inside["start_ns"].to_numpy(),
                                          inside["end_ns"].to_numpy())
        cov = pd.Series(covered, dtype="int64").reindex(steps.index, fill_value=0).to_numpy()
        steps["Other"] = np.maximum(steps["duration_ns"].to_numpy() - cov, 0)
    phases = phases.drop(columns=["_step_row"], errors="ignore")
    return steps[STEP_COLUMNS], phases[PHASE_COLUMNS] if len(phases) else phases


def kernels_frame(events: pd.DataFrame) -> pd.DataFrame:
    """GPU kernels (category gpu); the GPU integration fills this table."""
    return pd.DataFrame({c: [] for c in KERNEL_COLUMNS})
