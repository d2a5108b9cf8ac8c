"""StepOutlier: steps far slower than the typical step, and what was slow in them."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.quantities import epoch_start_wait, loop_starts
from stepscope.analysis.rules.advice import TORCH, advice, framework_of
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.dataloader import keeps_workers
from stepscope.core.vocabulary import (GETNEXT, INTERRUPTED, KERAS_PROFILER_WINDOW, OTHER, PHASES,
                                       TORCH_OP_WINDOW_SPANS, TRAIN)

PARTS = (*PHASES, OTHER)
# Framework spans of stepscope's own profiler windows (torch operator windows, Keras's sampled
# steps): a step that one touches carries profiling cost, which is not the job's.
PROFILER_WINDOWS = (*TORCH_OP_WINDOW_SPANS, KERAS_PROFILER_WINDOW)


def _profiled(steps, windows) -> np.ndarray:
    """True for the steps (of one process) that overlap one of its profiler windows."""
    out = np.zeros(len(steps), dtype=bool)
    start, end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    for ws, we in zip(windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy()):
        out |= (start < we) & (end > ws)
    return out


class StepOutlier(Rule):
    name = "StepOutlier"
    summary = "Steps much slower than the median step of their rank and mode (robust statistics)."
    params = {
        "factor": Param(2.0, "ratio", "a step is an outlier above this multiple of the median step time..."),
        "mad_multiple": Param(8.0, "ratio", "...and above the median by this many robust standard deviations "
                                            "(1.4826 x median absolute deviation)"),
        "min_excess_s": Param(0.05, "s", "...and longer than the median by at least this much (ignores "
                                         "scheduler hiccups on short steps)"),
        "min_steps": Param(10, "steps", "ranks/modes with fewer steps are not judged"),
        "warmup_steps": Param(1, "steps", "first steps of each rank and mode left out (and, in eval and predict, "
                                          "the first step of every pass: a new iterator, a retrace)"),
        "min_outliers": Param(1, "steps", "fire when a rank and mode has at least this many outlier steps"),
        "mode": Param("all", "", "the steps judged: `all` modes (each on its own), or only `train`, `eval` or "
                                 "`predict` steps", choices=("all", "train", "eval", "predict")),
        "epoch_start_s": Param(0.01, "s", "PyTorch: where the train outliers slow in GetNext are the first steps "
                                          "of epochs, name what persistent_workers=True would save (as "
                                          "GetNextBottleneck does, with its figure) when those steps wait at "
                                          "least this much longer than the slowest tenth of the others"),
    }

    def not_applicable(self, run):
        if not len(run.steps):
            return "no steps"
        return None

    def evaluate(self, run, p):
        out = []
        steps = run.steps
        every_step = steps
        steps = steps[steps["mode"] != INTERRUPTED]  # no iteration that finished: not judged
        starts = None
        windows = run.select(categories=["framework"], names=list(PROFILER_WINDOWS),
                             columns=["process", "start_ns", "end_ns"])
        if p.get("mode", "all") != "all":
            steps = steps[steps["mode"] == p["mode"]]
        for (process, rank, mode), s in steps.groupby(["process", "rank", "mode"], dropna=False, sort=True,
                                                      observed=True):
            s = s.sort_values("start_ns").iloc[int(p["warmup_steps"]):]
            if mode != TRAIN:  # each evaluation pass warms up anew (a new iterator, a retrace): its first step
                if starts is None:
                    starts = loop_starts(run.select(categories=["step"], kinds=["instant"]), every_step)
                s = s[~starts.reindex(s.index, fill_value=False).to_numpy(dtype=bool)]
            if len(windows):
                s = s[~_profiled(s, windows[windows["process"].astype(str) == str(process)])]
            if len(s) < p["min_steps"]:
                continue
            d = s["duration_ns"].to_numpy(dtype=float)
            med = float(np.median(d))
            sigma = 1.4826 * float(np.median(np.abs(d - med)))
            bad = s[(d > p["factor"] * med) & (d > med + p["mad_multiple"] * sigma)
                    & (d > med + p["min_excess_s"] * 1e9)]
            if bad.empty or len(bad) < p.get("min_outliers", 1):
                continue
            typical = s[list(PARTS)].median()
            rows, culprits = [], []
            for r in bad.itertuples():
                excess = {part: getattr(r, part) - typical[part] for part in PARTS}
                slowest = max(excess, key=excess.get)
                culprits.append(slowest)
                rows.append({"step": int(r.step), "duration_ms": round(r.duration_ns / 1e6, 3),
                             "slowest_part": slowest, "excess_ms": round(excess[slowest] / 1e6, 3)})
            main = max(set(culprits), key=culprits.count)
            where = "outside every phase (Other)" if main == "Other" else f"in {main}"
            listed = ", ".join(str(r["step"]) for r in rows[:10]) + (" ..." if len(rows) > 10 else "")
            recommendation = ("Look at these steps in the timeline. Time in Other points at work between "
                              "phases (checkpointing, logging, evaluation, garbage collection); in GetNext at "
                              "an uneven data pipeline; in Forward/Backward at changing input shapes or "
                              "recompilation. Make periodic work asynchronous or less frequent.")
            epoch = None
            if mode == TRAIN and main == GETNEXT and framework_of(run) == TORCH and not keeps_workers(run, process):
                if starts is None:
                    starts = loop_starts(run.select(categories=["step"], kinds=["instant"]), every_step)
                epoch = _epoch_starts(bad, rows, culprits, starts, every_step[every_step["process"] == process],
                                      p["epoch_start_s"])
            if epoch is not None:
                edges = {r.get("epoch") for r in rows}
                listed += ": the first" + ("" if edges == {"first"} else " and last") + " steps of epochs"
                recommendation = advice("epoch_start", TORCH, **epoch).strip()
            evidence = {"process": str(process), "mode": mode, "median_ms": round(med / 1e6, 3),
                        "robust_sigma_ms": round(sigma / 1e6, 3), "steps_judged": int(len(s)),
                        "outliers": rows[:50], "mostly": main}
            if epoch is not None:
                evidence["epoch_start"] = epoch
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)}: {len(rows)} of {len(s)} {mode} steps took more than "
                         f"{p['factor']:g}x the median {med / 1e6:.1f} ms (steps {listed}); the extra time is "
                         f"mostly {where}"),
                recommendation=recommendation, evidence=evidence,
                cost_ms_per_step=float((bad["duration_ns"] - med).sum()) / len(s) / 1e6))
        return out


def _epoch_starts(bad, rows, culprits, starts, process_steps, min_s):
    """The persistent-workers figure (quantities.epoch_start_wait) where every outlier slow in
    GetNext is at an epoch's edge, else None: its first step (the DataLoader starts its
    workers again) or its last (the fetch that runs out shuts them down). Marks those rows
    ``epoch`` ``first`` or ``last``."""
    train = process_steps[process_steps["mode"] == TRAIN].sort_values("start_ns", kind="stable")
    first = starts.reindex(train.index, fill_value=False).to_numpy(dtype=bool)
    last = np.zeros(len(train), dtype=bool)
    if len(train):
        last[:-1] = first[1:]
        last[-1] = True
    edge = dict(zip(train.index, np.where(first, "first", np.where(last, "last", ""))))
    where = [edge.get(i, "") for i in bad.index]
    if not all(w for w, c in zip(where, culprits) if c == GETNEXT) or "first" not in where:
        return None
    epoch = epoch_start_wait(process_steps, starts, min_s)
    if epoch is None:
        return None
    for row, w in zip(rows, where):
        if w:
            row["epoch"] = w
    return epoch
