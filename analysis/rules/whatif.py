"""What fixing a finding's cause would save (SPEC §7): a finding's ``saving`` from a what-if
over the run's own steps, with its interval, and the statistics that judge steps: a sign
test over steps and a seeded bootstrap (the same run, the same figures). Rules and
``stepscope diff`` use them; nothing here knows a rule."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def saving_of(what_if: dict, step_ms: float, basis: str = "what-if") -> dict:
    """A finding's ``saving`` (SPEC §7) from a what-if's mean saving per step and its
    interval (``low``/``high``, None where not computed), with its ``share`` of the loop's
    ``step_ms`` (the median train step the figure is per step of)."""
    mean = float(what_if["ms_per_step"])
    low, high = what_if.get("low"), what_if.get("high")
    return {"ms_per_step": round(mean, 3), "share": round(mean / step_ms, 4) if step_ms > 0 else None,
            "low": None if low is None else round(float(low), 3),
            "high": None if high is None else round(float(high), 3), "basis": basis}


def per_step_saving(saved_ms: np.ndarray, step_ms: float) -> Optional[dict]:
    """The saving of a cause that costs ``saved_ms[i]`` in the i-th judged step: their mean
    and its interval (``interval``), as a finding's ``saving``; None without steps."""
    values = np.asarray(saved_ms, dtype=float)
    if not len(values):
        return None
    low, high = interval(values)
    return saving_of({"ms_per_step": float(values.mean()), "low": low, "high": high}, step_ms)


def difference_of_means(a: np.ndarray, b: np.ndarray, level: float = 0.9) -> tuple:
    """(mean of ``a`` less mean of ``b``, and the ``level`` interval of it): a bootstrap of
    each sample apart, seeded; the normal approximation beyond 2000 values a side."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(a) or not len(b):
        return 0.0, 0.0, 0.0
    d = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return d, d, d
    if max(len(a), len(b)) > 2000:
        half = 1.6449 * (a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)) ** 0.5
        return d, d - half, d + half
    rng = np.random.default_rng(0)
    diffs = (a[rng.integers(0, len(a), (1000, len(a)))].mean(axis=1)
             - b[rng.integers(0, len(b), (1000, len(b)))].mean(axis=1))
    tail = 100 * (1 - level) / 2
    return d, float(np.percentile(diffs, tail)), float(np.percentile(diffs, 100 - tail))


def sign_test(positive: int, negative: int) -> float:
    """One-sided sign test: the chance of ``positive`` or more of ``positive + negative``
    steps positive where each is a coin flip (ties left out). Exact to 1000 steps, then the
    normal approximation."""
    n = positive + negative
    if n == 0:
        return 1.0
    if n > 1000:
        z = (positive - 0.5 * n - 0.5) / (0.25 * n) ** 0.5
        return round(0.5 * math.erfc(z / 2 ** 0.5), 6)
    return round(sum(math.comb(n, k) for k in range(positive, n + 1)) / 2 ** n, 6)


def interval(values: np.ndarray, level: float = 0.9) -> tuple:
    """The ``level`` interval of the mean of ``values`` (one per step): a bootstrap over the
    steps with a fixed seed (the same run gets the same interval), the normal approximation
    beyond 2000 steps."""
    if not len(values):
        return 0.0, 0.0
    tail = 100 * (1 - level) / 2
    if len(values) > 2000:
        half = 1.6449 * float(values.std(ddof=1)) / len(values) ** 0.5
        return float(values.mean()) - half, float(values.mean()) + half
    means = values[np.random.default_rng(0).integers(0, len(values), (1000, len(values)))].mean(axis=1)
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))
