"""The time between a thread's loops (SPEC §3): where a loop ended (an end mark: a
loader that ran out, a framework's ``loop_ended``) and the next step of the thread
began -- validation start-up, an epoch's end. No moment of the loop is unaccounted:
what is in no step is named here, with its time per epoch and the framework actions
that took most of it."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.quantities import ms
from stepscope.analysis.store.frames import groups
from stepscope.core.vocabulary import INTERRUPTED, LOOP_MARK, TRAIN

VALIDATION_START = "validation start-up"
EPOCH_END = "epoch end"
NEXT_LOOP = "the next loop's set-up"  # a new model, fold or fit built (analysis/loops.py)
BETWEEN = "between loops"
TOP_ACTIONS = 3  # the framework actions named, by their time inside the intervals...
MIN_ACTION_SHARE = 0.05  # ...each with at least this share of the largest one's


def _kind(before: str, after: str, trained: bool) -> str:
    """What an interval is, by the modes of the steps around it (``trained``: a train step
    came before it on its thread; before the first, setup such as a dry run's aftermath)."""
    if after == TRAIN and trained:
        return EPOCH_END  # validation's end, epoch-end callbacks, checkpointing, the next epoch's start
    return VALIDATION_START if before in (TRAIN, INTERRUPTED) else BETWEEN


def intervals(steps: pd.DataFrame) -> pd.DataFrame:
    """Per thread, each gap between a step's end and the next step's start:
    process, tid, kind, start_ns, end_ns."""
    rows = []
    for (process, tid), s in groups(steps, ["process", "tid"], ["mode", "start_ns", "end_ns"]):
        if not s["start_ns"].is_monotonic_increasing:
            s = s.sort_values("start_ns", kind="stable")
        start, end = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
        gaps = np.flatnonzero(start[1:] > end[:-1])
        if not len(gaps):
            continue
        trained = np.cumsum(s["mode"].isin((TRAIN, INTERRUPTED)).to_numpy()) > 0  # through each step
        before = s["mode"].iloc[gaps].astype(str).to_numpy()  # (strings of the steps around gaps only)
        after = s["mode"].iloc[gaps + 1].astype(str).to_numpy()
        for i, b, a in zip(gaps, before, after):
            rows.append((process, tid, _kind(b, a, bool(trained[i])), int(end[i]), int(start[i + 1])))
    return pd.DataFrame(rows, columns=["process", "tid", "kind", "start_ns", "end_ns"])


def _largest_actions(run, gaps: pd.DataFrame, epochs: int) -> dict:
    """The framework actions (Lightning's hooks, a checkpoint) with most time inside the
    intervals, ms per epoch."""
    spans = run.select(categories=["framework"], kinds=["span"], columns=["process", "name", "start_ns", "end_ns"])
    if not len(spans):
        return {}
    inside = np.zeros(len(spans), dtype=bool)
    s0, s1 = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    procs = spans["process"].astype(str).to_numpy()
    for g in gaps.itertuples():
        inside |= (procs == str(g.process)) & (s0 >= g.start_ns) & (s1 <= g.end_ns)
    picked = spans[inside]
    if not len(picked):
        return {}
    total = (picked["end_ns"] - picked["start_ns"]).groupby(picked["name"].astype(str)).sum()
    # (a hook of stepscope's own, a few microseconds, is not named; nor is an action that holds
    # a negligible share of the intervals: "mostly" must be true)
    floor = MIN_ACTION_SHARE * max(float(total.max()), float((gaps["end_ns"] - gaps["start_ns"]).sum()))
    return {str(name): ms(ns / epochs) for name, ns in total.nlargest(TOP_ACTIONS).items() if ns >= floor}


def between_loops(run) -> Optional[dict]:
    """{"epochs", "per_epoch_ms", "total_ms", "parts": {kind: ms per epoch}, "largest":
    {framework action: ms per epoch}}, or None where the loops leave no time outside
    their steps. Epochs: the training passes (one more than the intervals before a
    train step), or the passes of a run without training."""
    steps = run.steps
    if not len(steps):
        return None
    gaps = intervals(steps)
    if not len(gaps):
        return None
    marks = run.select(categories=["framework"], kinds=["instant"], names=[LOOP_MARK], columns=["process", "start_ns"])
    for process, m in marks.groupby("process", observed=True):
        at = np.sort(m["start_ns"].to_numpy(np.int64))
        mine = (gaps["process"].astype(str) == str(process)).to_numpy()
        # a gap holding a loop mark is where the next loop was set up (its model built), no epoch's end
        holds = np.searchsorted(at, gaps["end_ns"].to_numpy(np.int64), side="right") > \
            np.searchsorted(at, gaps["start_ns"].to_numpy(np.int64), side="left")
        gaps.loc[mine & holds, "kind"] = NEXT_LOOP
    cost = gaps["end_ns"] - gaps["start_ns"]
    before_train = int((gaps["kind"] == EPOCH_END).sum())
    epochs = before_train + 1 if (steps["mode"] == TRAIN).any() else len(gaps) + 1
    parts = {kind: ms(float(ns) / epochs) for kind, ns in cost.groupby(gaps["kind"]).sum().items()}
    out = {"epochs": int(epochs), "per_epoch_ms": ms(float(cost.sum()) / epochs),
           "total_ms": ms(float(cost.sum())), "intervals": int(len(gaps)), "parts": parts}
    largest = _largest_actions(run, gaps, epochs)
    if largest:
        out["largest"] = largest
    return out


def format_line(b: dict) -> str:
    parts = ", ".join(f"{kind} {v:.1f} ms" for kind, v in b["parts"].items())
    line = (f"  between loops {b['per_epoch_ms']:.1f} ms per epoch over {b['epochs']} epoch(s), in no step: "
            f"{parts}")
    if b.get("largest"):
        line += " (mostly " + ", ".join(f"{name} {v:.1f} ms" for name, v in b["largest"].items()) + ")"
    return line
