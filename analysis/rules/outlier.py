"""StepOutlier: steps far slower than the typical step, and what was slow in them."""

from __future__ import annotations

import copy

import numpy as np

from stepscope.analysis.compilation import compilation as compilation_block
from stepscope.analysis.loop import collection_steps
from stepscope.analysis.loops import step_loops
from stepscope.analysis.quantities import epoch_start_wait, loop_starts
from stepscope.analysis.rules.advice import TORCH, advice, framework_of
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.dataloader import keeps_workers
from stepscope.analysis.rules.gpudata import memo
from stepscope.analysis.rules.whatif import per_step_saving
from stepscope.analysis.store.frames import groups
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
    summary = ("Steps much slower than the median step of their rank and mode (robust statistics), where they "
               "recur or cost a share of the time: one slow step, or slow steps only in the first of several "
               "passes (warm-up), is no finding (the summary's `rule_details` lists them).")
    params = {
        "factor": Param(2.0, "ratio", "a step is an outlier above this multiple of the median step time..."),
        "mad_multiple": Param(8.0, "ratio", "...and above the median by this many robust standard deviations "
                                            "(1.4826 x median absolute deviation)"),
        "min_excess_s": Param(0.02, "s", "...and longer than the median by at least this much (ignores "
                                         "scheduler hiccups on short steps)"),
        "min_steps": Param(10, "steps", "ranks/modes with fewer steps are not judged"),
        "warmup_steps": Param(1, "steps", "first steps of each rank and mode left out (and, in eval and predict, "
                                          "the first step of every pass: a new iterator, a retrace)"),
        "min_outliers": Param(1, "steps", "fire when a rank and mode has at least this many outlier steps "
                                          "(and they recur or cost enough: below)"),
        "min_recurring": Param(3, "steps", "outliers recur when there are at least this many and they come at "
                                           "a regular period (four at least), or make up `min_step_share` of "
                                           "the steps, or cost `min_cost_share` of the time; outliers at the "
                                           "same place in this many passes, or in every pass after the first "
                                           "(an epoch's first or last step), recur too"),
        "min_step_share": Param(0.05, "ratio", "...this share of the steps judged"),
        "min_cost_share": Param(0.05, "ratio", "...their excess over the median (the largest one's left out: one "
                                               "long step is no pattern), this share of the judged steps' time"),
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
        # copies: the rules' evaluation sets severities and relations on the findings it gets
        return [copy.deepcopy(finding) for finding, _ in self._judge(run, p) if finding is not None]

    def details(self, run, p):
        """Outliers that are no finding (one slow step, the first pass's warm-up): listed, so
        that a user who looks for them finds them (the report's step plot marks the slowest)."""
        quiet = [note for finding, note in self._judge(run, p) if finding is None and note]
        return {"outliers_not_reported": quiet[:20]} if quiet else None

    def _judge(self, run, p) -> list:
        """``_judged``'s verdicts, once per run and parameters (evaluate and details both ask)."""
        return memo(run, ("StepOutlier", tuple(sorted(p.items()))), lambda: list(self._judged(run, p)))

    def _judged(self, run, p):
        """(finding or None, the group's note) per rank and mode with outlier steps."""
        steps = run.steps
        every_step = steps
        steps = steps[steps["mode"] != INTERRUPTED]  # no iteration that finished: not judged
        starts = None
        windows = run.select(categories=["framework"], names=list(PROFILER_WINDOWS),
                             columns=["process", "start_ns", "end_ns"])
        if p.get("mode", "all") != "all":
            steps = steps[steps["mode"] == p["mode"]]
        loops = step_loops(run)
        keys = ["process", "rank", "mode"]
        if (loops > 0).any():  # each loop judged against its own median (a second model's steps differ)
            steps = steps.assign(loop=loops.reindex(steps.index).to_numpy())
            keys.append("loop")
        for key, group in groups(steps, keys):
            process, rank, mode = key[:3]
            loop = key[3] if len(key) > 3 else None
            group = group.sort_values("start_ns", kind="stable")
            s = group.iloc[int(p["warmup_steps"]):]
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
            if bad.empty:
                continue
            # outliers whose extra time is explained elsewhere: compiling (the compilation block),
            # a collection before the update (the loop note collection_between_updates)
            explained = None
            for why, hit in (("compiling (torch.compile, tf.function, JAX; the compilation block): explained, "
                              "not outliers", lambda: _compiled_in(run, bad, med)),
                             ("a collection before the update (many forwards with no backward: the loop note "
                              "collection_between_updates)",
                              lambda: _collecting(run, process, bad) if mode == TRAIN else None)):
                mask = hit()
                if mask is None or not mask.any():
                    continue
                if mask.all():
                    explained = why
                    break
                bad = bad[~mask]
            if explained is not None:
                yield None, {"process": str(process), "rank": clean_rank(rank), "mode": mode,
                             "steps": [int(x) for x in bad["step"].to_numpy()[:50]],
                             "why_not_reported": f"{rank_label(rank, process)}: their extra time is {explained}"}
                continue
            if starts is None:
                starts = loop_starts(run.select(categories=["step"], kinds=["instant"]), every_step)
            pattern = _pattern(group, bad, s, med, starts, p)
            label = rank_label(rank, process) + (f" (loop {int(loop)})" if loop is not None else "")
            if pattern["reported"] is None or len(bad) < p.get("min_outliers", 1):
                yield None, {"process": str(process), "rank": clean_rank(rank), "mode": mode,
                             "steps": [int(x) for x in bad["step"].to_numpy()[:50]],
                             "why_not_reported": f"{label}: {pattern['why_not']}"}
                continue
            stray = bad[~pattern["keep"]] if "keep" in pattern else bad.iloc[:0]
            bad = bad[pattern["keep"]] if "keep" in pattern else bad
            finding = self._finding(run, p, process, rank, mode, s, bad, med, sigma, starts, every_step, pattern)
            if len(stray):
                finding.evidence["outliers_apart"] = [int(x) for x in stray["step"].to_numpy()[:20]]
            if loop is not None:
                finding.evidence["loop"] = int(loop)
                finding.message = finding.message.replace(rank_label(rank, process), label, 1)
            yield finding, None

    def _finding(self, run, p, process, rank, mode, s, bad, med, sigma, starts, every_step, pattern):
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
            epoch = _epoch_starts(bad, rows, culprits, starts, every_step[every_step["process"] == process],
                                  p["epoch_start_s"])
        if epoch is not None:
            edges = {r.get("epoch") for r in rows}
            listed += ": the first" + ("" if edges == {"first"} else " and last") + " steps of epochs"
            recommendation = advice("epoch_start", TORCH, **epoch).strip()
        evidence = {"process": str(process), "mode": mode, "median_ms": round(med / 1e6, 3),
                    "robust_sigma_ms": round(sigma / 1e6, 3), "steps_judged": int(len(s)),
                    "outliers": rows[:50], "mostly": main, "pattern": pattern["reported"],
                    "cost_share": round(pattern["cost_share"], 4)}
        if epoch is not None:
            evidence["epoch_start"] = epoch
        return Finding(
            rule=self.name, rank=clean_rank(rank), severity="warning",
            message=(f"{rank_label(rank, process)}: {len(rows)} of {len(s)} {mode} steps took more than "
                     f"{p['factor']:g}x the median {med / 1e6:.1f} ms (steps {listed}; {pattern['reported']}, "
                     f"{100 * pattern['cost_share']:.1f}% of the time of these steps); the extra time is "
                     f"mostly {where}"),
            recommendation=recommendation, evidence=evidence,
            cost_ms_per_step=float((bad["duration_ns"] - med).sum()) / len(s) / 1e6,
            # what-if: each outlier at the median, the other steps as they were
            saving=per_step_saving(np.where(s.index.isin(bad.index),
                                            np.maximum(s["duration_ns"].to_numpy(dtype=float) - med, 0.0),
                                            0.0) / 1e6, med / 1e6))


def _collecting(run, process, bad) -> np.ndarray:
    """Which of these outlier steps begin with a collection before their update (a rollout:
    analysis/loop.py's ``collection_steps``, once per run)."""
    found = memo(run, "collection_steps", lambda: collection_steps(run.steps, lambda: run.phases))
    mine = set(found.loc[found["process"] == str(process), "step"]) if len(found) else set()
    return bad["step"].isin(mine).to_numpy()


def _pattern(group, bad, judged, med, starts, p) -> dict:
    """Whether a rank and mode's outliers say something to act on, and in what words.

    ``reported``: the pattern in words (None when the outliers are no finding: ``why_not``
    says why), and ``cost_share``: their excess over the median, as a share of the judged
    steps' time. Outliers are worth a finding when they recur -- at the same place (an
    epoch's first or last step: the loader restarting its workers, an end-of-epoch
    checkpoint) in ``min_recurring`` passes or in every pass after the first, or
    ``min_recurring`` of them or more at a regular period (four at least), or as
    ``min_step_share`` of the steps -- or when ``min_recurring`` of them or more cost
    ``min_cost_share`` of the time without the largest one. One slow step, and slow steps only in the first of several
    passes (its iterator, caches and traces warming up), are not."""
    durations = judged["duration_ns"].to_numpy(dtype=float)
    cost_share = float((bad["duration_ns"].to_numpy(dtype=float) - med).sum() / durations.sum())
    n, k = len(judged), len(bad)
    out = {"reported": None, "why_not": "", "cost_share": cost_share}
    # each step's pass (a new one at every loop start: an epoch, an evaluation pass) and place in it
    first = starts.reindex(group.index, fill_value=False).to_numpy(dtype=bool, copy=True)
    first[0] = True
    pass_id = np.cumsum(first) - 1
    lengths = np.bincount(pass_id)
    where = np.flatnonzero(group.index.isin(bad.index))
    bad_pass = pass_id[where]
    from_start = where - np.flatnonzero(first)[bad_pass]
    from_end = lengths[bad_pass] - 1 - from_start
    passes = len(lengths)
    share = f"{100 * cost_share:.1f}% of the time of the steps judged"
    if passes >= 2 and (bad_pass == 0).all():
        out["why_not"] = (f"{k} slow step(s), all in the first of {passes} passes over the data: its warm-up "
                          f"(a new iterator, caches, traces), not repeated later ({share})")
        return out
    # at the same place (the passes' edges, or one offset) in min_recurring passes, or in every
    # pass after the first (the first steps of epochs 2 and 3 of 3: a loader starting its
    # workers again); three quarters of the outliers there, a stray hiccup kept apart
    edges = (from_start == 0) | (from_end == 0)
    places = [("first", from_start == 0), ("last", from_end == 0), ("first or last", edges),
              (None, from_start == np.bincount(from_start).argmax()),
              (None, from_end == np.bincount(from_end).argmax())]
    for edge, on in places:
        in_passes = len(set(bad_pass[on]))
        if (on.sum() >= 2 and on.sum() >= 0.75 * k
                and (in_passes >= p["min_recurring"] or in_passes >= max(2, passes - 1))):
            place = f"the {edge} step of" if edge else "the same place in"
            out["reported"] = f"recurring at {place} {in_passes} of {passes} passes"
            out["keep"] = on  # the outliers of the pattern; a stray one is listed apart
            return out
    if k >= p["min_recurring"]:
        period = _period(bad["step"].to_numpy(dtype=np.int64))
        if period:
            out["reported"] = f"recurring every {period:g} steps"
            return out
        if k >= p["min_step_share"] * n:
            out["reported"] = f"{100 * k / n:.0f}% of the steps"
            return out
        excess = np.sort(bad["duration_ns"].to_numpy(dtype=float) - med)
        # costly without the largest one: one long step beside a few short hiccups is no pattern
        if excess[:-1].sum() / durations.sum() >= p["min_cost_share"]:
            out["reported"] = "costing " + share
            return out
    out["why_not"] = (f"{k} slow step(s) of {n}, {share}: " +
                      ("an isolated step" if k == 1 else "neither recurring nor costly enough") +
                      f" (a finding needs {int(p['min_recurring'])} or more at a regular period or as "
                      f"{100 * p['min_step_share']:g}% of the steps, or costing {100 * p['min_cost_share']:g}% of "
                      f"the time, or the same place in {int(p['min_recurring'])} passes or in every pass after "
                      f"the first)")
    return out


def _period(numbers: np.ndarray) -> float:
    """The period in steps at which most outliers come (0 where none): four of them at least,
    and three quarters of them, on one progression (a loaded machine's own hiccup may fall
    between). Three steps are two gaps, nearly equal by chance: not enough."""
    numbers = np.sort(numbers)
    gaps = np.diff(numbers)
    if len(gaps) < 3:
        return 0.0
    # the commonest gap first, then the median: a hiccup beside a stall (steps 7, 8, 22, 37,
    # 52) splits one gap and moves the median (14.5) but leaves the commonest (15)
    values, counts = np.unique(gaps, return_counts=True)
    candidates = [float(np.median(gaps))]
    if counts.max() >= max(2, len(gaps) // 2):  # a gap seen at least twice and as half of them
        candidates.insert(0, float(values[counts.argmax()]))
    best, best_on = 0.0, 0
    for period in candidates:
        on = _on_progression(numbers, period)
        if on > best_on:
            best, best_on = period, on
    return best if best_on >= max(4, 0.75 * len(numbers)) else 0.0


def _on_progression(numbers: np.ndarray, period: float) -> int:
    """The most outliers on one progression of this period (0 for periods under 2)."""
    if period < 2:
        return 0
    # a step off only on long periods: with period 6, one step either way would take half
    # of all steps as "on" it, and outliers at random would look periodic
    slack = max(0.5, 0.1 * period)
    on = 0
    for anchor in numbers:  # outliers on the progression through this one
        off = np.abs((numbers - anchor + period / 2) % period - period / 2)
        on = max(on, int((off <= slack).sum()))
    return on


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


def _compiled_in(run, bad, median_ns: float) -> np.ndarray:
    """Per outlier step, whether compiling (torch.compile, tf.function, JAX) took half or more
    of its extra time."""
    if compilation_block(run) is None:
        return np.zeros(len(bad), dtype=bool)
    extra = bad["duration_ns"].to_numpy(dtype=float) - median_ns
    return bad["compile_ns"].to_numpy(dtype=float) >= 0.5 * extra
