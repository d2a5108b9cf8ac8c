"""Loops: the training loops a process runs one after another (SPEC §3).

A script may train several things in sequence: k-fold with a new model per fold, a
second model after the first, fine-tuning after pre-training, the trials of a search.
The integrations record a loop mark (``LOOP_MARK``) where another loop begins: an
optimizer created after train steps of its thread (PyTorch, Lightning, Accelerate), a
second Keras ``fit``. Each step belongs to the loop of its process begun last before it,
numbered from 0; statistics and rules judge each loop apart (a model built between
loops is the next loop's warm-up, never a leak; a later loop's other step time is no
outlier of the first's).

Scripts that create an optimizer inside every iteration (a meta-learning inner loop)
would mark a loop every few steps: where a process's loops hold a median of fewer than
``MIN_LOOP_STEPS`` train steps, they are taken as that iteration's own structure, and
the process has one loop.
"""

from __future__ import annotations

from typing import List

import pandas as pd

from stepscope.analysis.quantities import other_share, phase_shares
from stepscope.analysis.tables.loop_numbers import MIN_LOOP_STEPS, loop_numbers  # noqa: F401 - the loops' API
from stepscope.core.vocabulary import LOOP_MARK, OTHER, TRAIN

def step_loops(run) -> pd.Series:
    """Each step's loop in its process (int, from 0), indexed like ``run.steps``: its
    ``loop`` column."""
    steps = run.steps
    if "loop" in steps:
        return steps["loop"].rename("loop")
    marks = run.select(categories=["framework"], kinds=["instant"], names=[LOOP_MARK],  # (tables of another kind)
                       columns=["process", "start_ns"])
    return loop_numbers(steps, marks)


def loops_block(run) -> List[dict]:
    """The summary's ``loops``: per process that ran more than one loop, each loop's steps
    per mode, its train steps' median, their phase shares (``phases``: Other's too) and
    its span; [] when every process ran one."""
    steps = run.steps
    if not len(steps):
        return []
    loops = step_loops(run)
    if not (loops > 0).any():
        return []
    out = []
    frame = steps.assign(loop=loops.to_numpy())
    several = frame.groupby("process", observed=True)["loop"].max() > 0
    for (process, loop), s in frame.groupby(["process", "loop"], observed=True, sort=True):
        if not several.get(process, False):
            continue
        train = s[s["mode"] == TRAIN]["duration_ns"]
        rank = s["rank"].iloc[0] if "rank" in s else None
        out.append({"process": str(process), "rank": None if pd.isna(rank) else int(rank), "loop": int(loop),
                    "steps": {str(m): int(n) for m, n in s["mode"].value_counts().items() if n},
                    "train_median_ms": round(float(train.median()) / 1e6, 3) if len(train) else None,
                    "phases": _shares(s[s["mode"] == TRAIN]),
                    "start_s": round(float(s["start_ns"].min() - steps["start_ns"].min()) / 1e9, 3),
                    "duration_s": round(float(s["end_ns"].max() - s["start_ns"].min()) / 1e9, 3)})
    return out


def _shares(train: pd.DataFrame) -> dict:
    """Each phase's share of the loop's train step time, and Other's (``phase_shares``)."""
    out = {name: p["share"] for name, p in phase_shares(train).items()}
    other = other_share(train)
    if other is not None:
        out[OTHER] = other["share"]
    return out


def format_lines(block: List[dict]) -> List[str]:
    lines = []
    for b in block:
        counts = ", ".join(f"{n} {m}" for m, n in b["steps"].items())
        median = f", train median {b['train_median_ms']:.2f} ms" if b["train_median_ms"] is not None else ""
        who = f"rank {b['rank']}" if b["rank"] is not None else b["process"]
        shares = "".join(f", {name} {100 * v:.0f}%" for name, v in b.get("phases", {}).items() if v >= 0.005)
        lines.append(f"  loop {b['loop']:<4} {who}: {counts}{median}, from {b['start_s']:.1f} s for "
                     f"{b['duration_s']:.1f} s{shares}")
    return lines
