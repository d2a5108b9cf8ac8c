"""Figures of the steps table, each computed in exactly one place.

``stepscope summary``, the report and the rules quote the same quantity with
the same number because they all call these functions (SPEC §7: "a finding's
figures equal the summary's figures for the same quantity"). A rule that
judges one rank calls them on that rank's steps; on a run with one training
process that is the summary's number, to the digit.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from stepscope.core.vocabulary import (COMPUTE_PHASES, END_MARK, GETNEXT, INTERRUPTED, OTHER, PHASES, TORCH_OP_WINDOW,
                                       TORCH_OP_WINDOW_SPANS, TRAIN)

SHARE_DIGITS = 4  # shares are ratios rounded to 4 digits: 0.7421 prints as 74.2%


def ms(ns) -> float:
    """Nanoseconds as milliseconds, rounded to the microsecond (the summary's unit)."""
    return round(float(ns) / 1e6, 3)


def percent(share: float) -> str:
    """A share as the summary prints it: 0.7421 -> '74.2%'."""
    return f"{100 * share:.1f}%"


def phase_total_column(phase: str) -> str:
    """The column a phase's summed time has in aggregated results (``forward_ns``)."""
    return f"{phase.lower()}_ns"


def phase_sums_sql() -> str:
    """Portable SQL select items: each phase's time summed over the steps (``phase_shares``'
    numerators), one ``phase_total_column`` each; analysis/export/sql.py runs them."""
    return ", ".join(f"SUM({p}) AS {phase_total_column(p)}" for p in PHASES)


def summary_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps phase shares are taken over: the train steps, or every step of a run without any."""
    if not len(steps):
        return steps
    train = steps[steps["mode"] == TRAIN]
    return train if len(train) else steps[steps["mode"] != INTERRUPTED]


def step_stats(steps: pd.DataFrame) -> dict:
    """Count and mean, median, p95, max step time (ms) of the given steps (SPEC §6 ``steps``)."""
    d = steps["duration_ns"].to_numpy()
    if not len(d):
        return {"count": 0, "mean_ms": 0.0, "median_ms": 0.0, "p95_ms": 0.0, "max_ms": 0.0}
    return {"count": int(len(d)), "mean_ms": ms(d.mean()), "median_ms": ms(np.median(d)),
            "p95_ms": ms(np.percentile(d, 95)), "max_ms": ms(d.max())}


def sampled_mask(steps: pd.DataFrame) -> Optional[np.ndarray]:
    """Keras measures the compute phases in sampled steps only (a profiler window per
    epoch). When fewer than half of the steps carry compute phases, those steps (True
    here) stand for the rest: compute shares are taken over them. None otherwise."""
    if not len(steps):
        return None
    sampled = np.logical_or.reduce([_values(steps, phase) > 0 for phase in COMPUTE_PHASES])
    n = int(np.count_nonzero(sampled))
    return sampled if 0 < n < len(steps) / 2 else None


def _values(steps: pd.DataFrame, column: str) -> np.ndarray:
    """A column as numbers, a missing value as 0 (as pandas' sums skip it)."""
    values = steps[column].to_numpy()
    if values.dtype.kind == "f" and np.isnan(values).any():
        values = np.nan_to_num(values)
    return values


def _total(values: np.ndarray, mask: Optional[np.ndarray] = None):
    """The values' sum (over ``mask``'s rows where given), as a pandas sum would give it."""
    return (values if mask is None else values[mask]).sum()


def phase_shares(steps: pd.DataFrame) -> Dict[str, dict]:
    """SPEC §6 ``phases`` over the given steps (one mode: ``summary_steps``, or one rank's
    train steps): per phase with any time, its count of steps, total_ms and share (its
    time over the steps' summed duration; compute phases of a sampled Keras run over the
    sampled steps, with ``sampled_steps``). Each column is summed once, as arrays: the
    rules ask this of every rank's steps, millions of them in a long run."""
    out: Dict[str, dict] = {}
    if not len(steps):
        return out
    sampled = sampled_mask(steps)
    duration = _values(steps, "duration_ns")
    within_all = float(_total(duration))
    within_sampled = float(_total(duration, sampled)) if sampled is not None else within_all
    for phase in PHASES:
        values = _values(steps, phase)
        total = _total(values)
        if total <= 0:
            continue
        compute = sampled is not None and phase in COMPUTE_PHASES
        part, within = (_total(values, sampled), within_sampled) if compute else (total, within_all)
        out[phase] = {"count": int(np.count_nonzero(values > 0)), "total_ms": ms(total),
                      "share": round(float(part) / within, SHARE_DIGITS) if within else 0.0}
        if compute:
            out[phase]["sampled_steps"] = int(np.count_nonzero(sampled))
    return out


def other_share(steps: pd.DataFrame) -> Optional[dict]:
    """Time in no phase (``Other``) of the given steps, as ``phase_shares`` gives a phase:
    total_ms and share (over the sampled steps of a sampled Keras run, whose other steps
    have their compute in Other), or None without steps."""
    if not len(steps) or OTHER not in steps:
        return None
    sampled = sampled_mask(steps)
    within = float(_total(_values(steps, "duration_ns"), sampled))
    other = _total(_values(steps, OTHER), sampled)
    out = {"total_ms": ms(other), "share": round(float(other) / within, SHARE_DIGITS) if within else 0.0}
    if sampled is not None:
        out["sampled_steps"] = int(np.count_nonzero(sampled))
    return out


def phase_share(steps: pd.DataFrame, phase: str) -> float:
    """One phase's share of the given steps, exactly as ``phase_shares`` gives it (0.0 if none)."""
    return phase_shares(steps).get(phase, {}).get("share", 0.0)


def steady_phase_share(steps: pd.DataFrame, phase: str, warmup_steps: int) -> float:
    """``phase_share`` without the first ``warmup_steps`` and the last step (where there are
    more): a loader's start-up and the exhausted iterator's shut-down are no steady wait."""
    ordered = steps.sort_values("start_ns")
    last = len(ordered) - 1 if len(ordered) > int(warmup_steps) + 1 else len(ordered)
    return phase_share(ordered.iloc[int(warmup_steps):last], phase)


def profiler_windows(run, steps: pd.DataFrame) -> Optional[dict]:
    """What stepscope's own PyTorch operator windows cost (their ``stepscope.op_window_open``
    and ``stepscope.op_window`` spans: opening starts torch's profiler, closing reads and
    writes every operator of the window's sampled steps), over the given steps' time
    (every mode: a window also closes where an eval step or the loop's end comes), or
    None without windows. The phases leave that time out (``tables.py``): it is in
    Other, and this says how much."""
    spans = run.select(categories=["framework"], names=list(TORCH_OP_WINDOW_SPANS),
                       columns=["name", "start_ns", "end_ns"])
    closed = int((spans["name"] == TORCH_OP_WINDOW).sum()) if len(spans) else 0
    if not closed:
        return None
    cost = float((spans["end_ns"] - spans["start_ns"]).sum())
    total = float(steps["duration_ns"].sum()) if len(steps) else 0.0
    return {"windows": closed, "total_ms": ms(cost),
            "share": round(cost / total, SHARE_DIGITS) if total else 0.0}


# --- epochs -------------------------------------------------------------------------------
def loop_starts(events: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """True for the steps that begin a loop over a data set (an epoch): the first step of
    each process, and every step whose process ended its previous step with an end mark
    (a loader that ran out, ``stepscope.end_step()``, Keras's epoch end)."""
    out = pd.Series(False, index=steps.index)
    if not len(steps):
        return out
    ev = events
    marks = ev[(ev["category"] == "step") & (ev["kind"] == "instant") & (ev["name"] == END_MARK)]
    ends = {str(p): np.sort(g["start_ns"].to_numpy()) for p, g in marks.groupby("process", observed=True)}
    for process, s in steps.groupby("process", observed=True, sort=False):
        s = s.sort_values("start_ns", kind="stable")
        e = ends.get(str(process), np.empty(0, dtype=np.int64))
        # number of end marks at or before each step's start: a new loop where it grows
        seen = np.searchsorted(e, s["start_ns"].to_numpy(), side="right")
        first = np.ones(len(s), dtype=bool)
        first[1:] = seen[1:] > seen[:-1]
        out.loc[s.index] = first
    return out


def epoch_start_wait(steps: pd.DataFrame, starts: pd.Series, min_s: float) -> Optional[dict]:
    """How much longer the train steps at an epoch boundary of one process wait for their
    batch (GetNext) than the other train steps, or None where that is not measurable.

    A PyTorch DataLoader without persistent workers starts its worker processes at the
    beginning of each epoch (the first step's GetNext) and shuts them down in the fetch
    that runs out (the epoch's last step's GetNext). ``excess_ms`` = median GetNext of the
    first steps of the epochs after the first minus median GetNext of the other steps,
    plus what the last steps of the epochs before the last wait beyond that median (when
    they wait longer). Measurable: at least two epochs after the first, two other steps,
    and the first steps' median above the other steps' 90th percentile by at least
    ``min_s`` seconds; with one epoch after the first (a two-epoch job), by five times
    that (one sample: a margin no jitter reaches). That margin keeps a loader that already keeps its workers
    (``persistent_workers=True``), whose first batch of an epoch waits about as long as
    the slowest batches of a steady epoch, from being told to keep them."""
    s = steps[steps["mode"] == TRAIN]
    if not len(s):
        return None
    order = np.argsort(s["start_ns"].to_numpy(), kind="stable")
    first = starts.reindex(s.index, fill_value=False).to_numpy(dtype=bool)[order]
    getnext = s[GETNEXT].to_numpy(dtype=float)[order]
    first[0] = True  # the process's first train step starts its first epoch
    firsts = np.flatnonzero(first)
    later = firsts[1:]  # epochs after the first: what persistent workers would save
    ends = later - 1  # the last steps of the epochs before the last
    other = np.ones(len(s), dtype=bool)
    other[firsts] = other[ends] = False
    other = getnext[other]
    if len(later) < 1 or len(other) < 2:
        return None
    start_med, end_med = float(np.median(getnext[later])), float(np.median(getnext[ends]))
    other_med, other_p90 = float(np.median(other)), float(np.percentile(other, 90))
    if start_med - other_p90 < min_s * 1e9 * (1 if len(later) >= 2 else 5):
        return None
    excess = start_med - other_med + max(0.0, end_med - other_med)
    return {"epochs": int(len(firsts)), "first_step_getnext_ms": ms(start_med),
            "last_step_getnext_ms": ms(end_med), "other_getnext_ms": ms(other_med),
            "other_getnext_p90_ms": ms(other_p90), "excess_ms": ms(excess)}
