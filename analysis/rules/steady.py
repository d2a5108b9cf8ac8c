"""Growth that goes on after the warm-up: what HostMemoryIncrease and GPUMemoryIncrease judge.

A healthy job's memory often rises while it warms up (caches filled, pools
reserved, optimizer state created, the first batches of each shape) and then
stays flat; a leak keeps rising to the end. Both memory rules therefore judge
the *steady state*: the steps after a warm-up, which lasts

* at least ``warmup_steps`` train steps (a documented count);
* while the first steps are slower than ``settle_factor`` times the median step
  of the later half (the step time has not settled);
* until the memory level settles: the series, in steps, is split where two
  straight lines fit it best, and the warm-up ends at that knee when memory
  grew more than ``settle_ratio`` times faster per step before it than after;

and never more than ``max_warmup_share`` of the steps. In the steady state memory
must grow (the rule's thresholds), steadily (``min_trend`` over the steady state),
and go on growing through its later half: rank correlation ``min_trend`` there
too, at no less than ``min_late_ratio`` of the steady state's growth per step.
The rate of that later half is the rate reported, and what the time until the
memory runs out is computed from. A steady state shorter than ``min_window_s``,
than ``min_window_share`` of the loop, or with fewer than ``MIN_WINDOW_SAMPLES``
samples is not judged: no rate is extrapolated from it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.rules.base import Param

PARAMS = {
    "warmup_steps": Param(2, "steps", "first train steps always left out (the optimizer creates its state and "
                                      "the allocator its pools in the first steps)"),
    "settle_factor": Param(1.5, "ratio", "the warm-up also lasts while the first steps (the median of three "
                                         "in a row) take more than this multiple of the median step time of the "
                                         "later half of the loop"),
    "settle_ratio": Param(3.0, "ratio", "...and until memory settles: it ends at the knee where memory grew more "
                                        "than this many times faster per step before than after"),
    "max_warmup_share": Param(0.5, "ratio", "the warm-up never takes more than this share of the steps: the "
                                            "later half is always judged"),
    "min_late_ratio": Param(0.5, "ratio", "memory must go on growing in the later half of the steady state, at "
                                          "no less than this fraction of its growth per step over all of it"),
    "min_window_s": Param(5.0, "s", "the steady state must last at least this long to be judged: in a shorter "
                                    "one a one-off change (DataLoader workers started again at an epoch, each "
                                    "faulting in its memory over a few seconds) looks like a leak, and a rate "
                                    "from it extrapolates nothing"),
    "min_window_share": Param(0.25, "ratio", "...and at least this share of the loop's time (its first train "
                                             "step's start to its last one's end): a late burst after a long "
                                             "warm-up is not the loop's trend"),
}

#: ...and hold at least this many memory samples (at the default 100 ms interval 5 s hold 50;
#: a coarser STEPSCOPE_INTERVAL_MS leaves too few points for the trend and the knee). A count,
#: not a parameter: SPEC §7 gives rules' parameters in seconds, percent and ratios.
MIN_WINDOW_SAMPLES = 20


def rank_correlation(values: np.ndarray) -> float:
    """Spearman's correlation of values with their order in time (1: always rising)."""
    if len(values) < 2:
        return 0.0
    ranks = pd.Series(values).rank().to_numpy()
    if np.all(ranks == ranks[0]):
        return 0.0
    return float(np.corrcoef(ranks, np.arange(len(values)))[0, 1])


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y over x (0 when x does not vary)."""
    if len(x) < 2:
        return 0.0
    dx = x - x.mean()
    den = float((dx * dx).sum())
    return float((dx * (y - y.mean())).sum() / den) if den > 0 else 0.0


def _sse_prefix(x: np.ndarray, y: np.ndarray):
    """Residual sums of squares of straight-line fits to every prefix x[:k], y[:k]."""
    k = np.arange(1, len(x) + 1, dtype=float)
    sx, sy = np.cumsum(x), np.cumsum(y)
    sxx, sxy, syy = np.cumsum(x * x), np.cumsum(x * y), np.cumsum(y * y)
    vxx, vxy, vyy = sxx - sx * sx / k, sxy - sx * sy / k, syy - sy * sy / k
    with np.errstate(divide="ignore", invalid="ignore"):
        sse = vyy - np.where(vxx > 0, vxy * vxy / vxx, 0.0)
    return np.maximum(sse, 0.0)


def memory_knee(pos: np.ndarray, v: np.ndarray, limit: float, ratio: float) -> Optional[float]:
    """The step position where memory settles (the knee of the best two-line fit, at
    most ``limit``) when it grew more than ``ratio`` times faster per step before it
    than after; None when there is no such knee."""
    n = len(v)
    if n < 8:
        return None
    left = _sse_prefix(pos, v)  # left[j - 1]: fit of samples [0, j)
    right = _sse_prefix(pos[::-1], v[::-1])[::-1]  # right[j]: fit of samples [j, n)
    js = np.arange(3, n - 2)  # at least three samples each side
    js = js[pos[js] <= limit]
    if not len(js):
        return None
    j = int(js[np.argmin(left[js - 1] + right[js])])
    before, after = _slope(pos[:j], v[:j]), _slope(pos[j:], v[j:])
    if before > 0 and before > ratio * max(after, 0.0):
        return float(pos[j])
    return None


def step_positions(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Each time as a position in steps: k + the elapsed fraction of step k (steps sorted)."""
    k = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)
    dur = np.maximum(ends[k] - starts[k], 1)
    return k + np.clip((t - starts[k]) / dur, 0.0, 1.0)


def median_of_three(values: np.ndarray, last: float) -> np.ndarray:
    """The median of each value and the two after it; ``last`` for the last two (pandas'
    ``rolling(3).median().shift(-2)``, without its rolling machinery: a run has millions of steps)."""
    out = np.full(len(values), last, dtype=float)
    if len(values) >= 3:
        a, b, c = values[:-2], values[1:-1], values[2:]
        out[:-2] = np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    return out


def steady_growth(steps: pd.DataFrame, t: np.ndarray, v: np.ndarray, p: dict,
                  short_ok: bool = False) -> Optional[dict]:
    """Judges one memory series over one loop's steps (a process's train steps, sorted).

    t: sample times (ns) and v: values, sorted by time. Returns None when the series
    cannot be judged; else the steady state's figures and ``growing`` (all but the
    rule's own size thresholds passed): ``first``/``last`` (medians of the steady
    state's first and last ``window_share``), ``trend``, ``trend_late``,
    ``rate_per_s`` (of the later half), ``warmup`` (steps left out) and why, and
    ``t0``/``t1``/``steps`` of the steady state. A steady state too short to extrapolate
    from (``_long_enough``) gives None, or with ``short_ok`` its figures with ``short``
    set, and ``fit``: how much of the memory's variance a straight line over the steps
    explains (R^2: a leak of a similar amount every step is near 1)."""
    if not steps["start_ns"].is_monotonic_increasing:  # (a process's steps usually are)
        steps = steps.sort_values("start_ns", kind="stable")
    starts, ends = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    numbers = steps["step"].to_numpy()
    n = len(steps)
    inside = (t >= starts[0]) & (t <= ends[-1])
    t, v = t[inside], v[inside].astype(float)
    documented = min(int(p["warmup_steps"]), n)
    limit = max(documented, int(p["max_warmup_share"] * n))
    if n - documented < 2 or len(v) < 8:
        return None
    # the step time settles: at the first of three consecutive steps whose median is no
    # longer much slower than the later half's median step (one slow step is a hiccup)
    dur = (ends - starts).astype(float)
    typical = float(np.median(dur[documented + (n - documented) // 2:]))
    run3 = median_of_three(dur, typical)
    slow = run3[documented:limit] > p["settle_factor"] * typical
    timed = documented + (len(slow) if slow.all() else int(np.argmin(slow)))
    # the memory level settles: the knee of the series in steps
    pos = step_positions(starts, ends, t)
    after = pos >= documented
    knee = memory_knee(pos[after], v[after], limit, p["settle_ratio"])
    settled = int(np.ceil(knee)) if knee is not None else 0
    warmup = min(max(documented, timed, settled), limit)
    why = ("memory" if warmup == settled and settled > max(documented, timed)
           else "step time" if warmup == timed and timed > documented else "steps")
    keep = pos >= warmup
    t, v, pos = t[keep], v[keep], pos[keep]
    short = not _long_enough(int(starts[warmup]), int(ends[-1]), int(ends[-1] - starts[0]), len(v), p)
    if short and (not short_ok or len(v) < 8):
        return None
    k = max(2, int(len(v) * p["window_share"]))
    first, last = float(np.median(v[:k])), float(np.median(v[-k:]))
    late = pos >= (warmup + n) / 2
    if late.sum() < 3:
        return None
    per_step, late_per_step = _slope(pos, v), _slope(pos[late], v[late])
    trend, trend_late = rank_correlation(v), rank_correlation(v[late])
    growing = (last > first and trend >= p["min_trend"] and trend_late >= p["min_trend"]
               and late_per_step > 0 and late_per_step >= p["min_late_ratio"] * per_step)
    return {"first": first, "last": last, "growth": last - first, "trend": trend, "trend_late": trend_late,
            "per_step": per_step, "late_per_step": late_per_step,
            "rate_per_s": max(_slope(t[late] / 1e9, v[late]), 0.0), "growing": bool(growing),
            "warmup": int(warmup), "warmup_why": why, "samples": int(len(v)),
            "t0": int(starts[warmup]), "t1": int(ends[-1]),
            "steps": [int(numbers[warmup]), int(numbers[-1])], "last_value": float(v[-1]),
            "short": bool(short), "fit": _line_fit(pos, v)}


def _line_fit(x: np.ndarray, y: np.ndarray) -> float:
    """R^2 of the least-squares line of y over x (0 where y does not vary)."""
    total = float(((y - y.mean()) ** 2).sum())
    if len(x) < 3 or total <= 0:
        return 0.0
    residual = y - y.mean() - _slope(x, y) * (x - x.mean())
    return max(0.0, 1.0 - float((residual ** 2).sum()) / total)


def _long_enough(t0: int, t1: int, loop_ns: int, samples: int, p: dict) -> bool:
    """Whether a steady state from t0 to t1 (ns) with this many samples can be judged:
    ``min_window_s``, ``min_window_share`` of the loop and ``MIN_WINDOW_SAMPLES``."""
    window = t1 - t0
    return (samples >= MIN_WINDOW_SAMPLES and window >= p.get("min_window_s", 0.0) * 1e9
            and window >= p.get("min_window_share", 0.0) * loop_ns)


def until_full(free_bytes: float, rate_per_s: float) -> Optional[float]:
    """Seconds until free_bytes are used up at rate_per_s (None when not growing or unknown)."""
    if not rate_per_s or rate_per_s <= 0 or free_bytes is None or not np.isfinite(free_bytes):
        return None
    return max(float(free_bytes), 0.0) / rate_per_s


def duration_text(seconds: Optional[float]) -> str:
    if seconds is None:
        return "an unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def evidence_of(g: dict, mb: float) -> dict:
    """The steady-state figures every memory finding carries."""
    rate = g["rate_per_s"] * 60 / mb
    return {"warmup_steps_left_out": g["warmup"], "warmup_ends_by": g["warmup_why"],
            "steps": g["steps"], "trend": round(g["trend"], 3), "trend_late": round(g["trend_late"], 3),
            "late_growth_ratio": round(g["late_per_step"] / g["per_step"], 3) if g["per_step"] > 0 else None,
            "growth_mb_per_step": round(g["late_per_step"] / mb, 3), "rate_mb_per_min": round(rate, 1),
            "samples": g["samples"], "window_s": round((g["t1"] - g["t0"]) / 1e9, 3)}
