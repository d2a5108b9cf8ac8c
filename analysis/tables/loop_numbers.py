"""Each step's loop in its process: the ``loop`` column of the steps table (the loops'
meaning, and why an optimizer made in every iteration is one loop: ``analysis/loops.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.core.vocabulary import TRAIN

MIN_LOOP_STEPS = 10  # a process's loops holding a median of fewer train steps are one loop


def loop_numbers(steps: pd.DataFrame, marks: pd.DataFrame) -> pd.Series:
    """The loop of each step: the number of its process's loop marks at or before its start."""
    out = pd.Series(np.zeros(len(steps), dtype=np.int64), index=steps.index, name="loop")
    if not len(steps) or not len(marks):
        return out
    times = {str(p): np.sort(g["start_ns"].to_numpy(np.int64)) for p, g in marks.groupby("process", observed=True)}
    for process, s in steps.groupby("process", observed=True, sort=False):
        at = times.get(str(process))
        if at is None:
            continue
        loop = np.searchsorted(at, s["start_ns"].to_numpy(np.int64), side="right")
        train = (s["mode"] == TRAIN).to_numpy()
        per_loop = np.bincount(loop[train], minlength=len(at) + 1)
        held = per_loop[per_loop > 0]
        if len(held) > 2 and np.median(held) < MIN_LOOP_STEPS:
            continue  # an optimizer made in every iteration: the iteration's structure, one loop
        # loops numbered as they come, none left empty (two marks with no step between are one edge)
        _, dense = np.unique(loop, return_inverse=True)
        out.loc[s.index] = dense.astype(np.int64)
    return out
