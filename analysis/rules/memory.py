"""HostMemoryIncrease: a rank's resident memory keeps growing through its training loop,
after its warm-up (analysis/rules/steady.py)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from stepscope.analysis.loops import step_loops
from stepscope.analysis.rules import steady
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.gpudata import memo, node_of, process_ranks, samples_of, steps_by_process

MB = 1 << 20
_EMPTY = pd.DataFrame({"mode": [], "start_ns": [], "end_ns": [], "step": []})


def loop_steps(steps):
    """The steps a process's memory is judged over (``steps``: that process's): its train
    steps, or all its steps when it has none."""
    train = steps[steps["mode"] == "train"]
    return train if len(train) else steps


def _loops_of(by_process, ranks, loops):
    """(process, rank, loop or None, the steps judged) per loop of each process: its memory
    is judged within each loop (a model built between loops is the next one's warm-up);
    loop None where the process ran one."""
    for process, rank in ranks:
        steps = loop_steps(by_process.get(process, _EMPTY))
        numbers = loops.reindex(steps.index).fillna(0).to_numpy(np.int64) if len(steps) else np.zeros(0, np.int64)
        if not len(numbers) or numbers.max() == 0:
            yield process, rank, None, steps
            continue
        for loop in np.unique(numbers):
            yield process, rank, int(loop), steps[numbers == loop]


def _in_loop(g: dict) -> str:
    return f" (loop {g['loop']})" if g.get("loop") is not None else ""


def free_memory(system, node, t1) -> float:
    """Bytes of the node's memory still free (total - used) at its last sample up to t1; NaN if unknown."""
    mem = system[(system["node"] == node) & (system["timestamp_ns"] <= t1)
                 & system["metric"].isin(["mem_used", "mem_total"])]
    if mem.empty:
        return float("nan")
    last = mem[mem["timestamp_ns"] == mem["timestamp_ns"].max()]
    vals = dict(zip(last["metric"], last["value"]))
    return float(vals["mem_total"] - vals["mem_used"]) if {"mem_used", "mem_total"} <= set(vals) else float("nan")


class HostMemoryIncrease(Rule):
    name = "HostMemoryIncrease"
    summary = ("Host RSS of a rank (with its DataLoader workers) keeps rising after the warm-up, through the later "
               "part of training (the steady state: see below).")
    params = {
        "min_increase_mb": Param(200, "MB", "fire when RSS grows in the steady state by more than this..."),
        "min_increase_ratio": Param(0.10, "ratio", "...and by more than this fraction of its value when the "
                                                   "steady state begins"),
        "min_trend": Param(0.8, "ratio", "rank correlation of RSS with time, over the steady state and over its "
                                         "later half: steady growth that goes on, not one spike"),
        "window_share": Param(0.2, "ratio", "compare the first and last this share of the steady state"),
        **steady.PARAMS,
        "min_fit": Param(0.95, "ratio", "a steady state too short to judge a trend in time (`min_window_s`, "
                                        "`min_window_share`) is still judged where memory grew by a similar "
                                        "amount at every step: a straight line over the steps explains at least "
                                        "this share of its variance (R^2), the other thresholds holding; no time "
                                        "until memory runs out is extrapolated from it"),
    }

    def not_applicable(self, run):
        if not len(run.steps):
            return "no steps"
        if not len(samples_of(run, "proc_rss")):
            return "no process memory samples"
        return None

    def why_not_judged(self, run, p):
        """The first process whose memory grew past the thresholds in a steady state too
        short to judge a trend, and not by a similar amount every step: its figures."""
        unjudged = self._judge(run, p)[1]
        return unjudged[0] if unjudged else None

    def evaluate(self, run, p):
        return self._findings(run, p, self._judge(run, p)[0])

    def _judge(self, run, p):
        """(process, rank, figures) of the growing processes, and why the others whose memory
        grew could not be judged; once per run and parameters (evaluate and why_not_judged ask)."""
        return memo(run, ("HostMemoryIncrease", tuple(sorted(p.items()))), lambda: self._judged(run, p))

    def _judged(self, run, p):
        found, unjudged = [], []
        rss = samples_of(run, "proc_rss")
        # a rank and its children, summed per sample; where its children were replaced during
        # the run (a DataLoader that starts its workers again every epoch), the rank's own
        # memory alone: each forked worker's RSS counts the pages it shares with the rank, and
        # old and new workers sampled alive together make a pool that comes and goes look
        # like growth
        child = rss["device"].astype(str).str.startswith("pid").to_numpy()
        replaced = _replaced_children(rss[child])
        judged = rss[~child | ~rss["process"].isin(replaced).to_numpy()]
        total = judged.groupby(["process", "timestamp_ns"], as_index=False)["value"].sum()
        by_process = steps_by_process(run.steps, ["mode", "start_ns", "end_ns", "step"])
        loops = step_loops(run)
        for process, rank, loop, steps in _loops_of(by_process, process_ranks(run.steps), loops):
            r = total[total["process"] == process].sort_values("timestamp_ns")
            g = steady.steady_growth(steps, r["timestamp_ns"].to_numpy(np.int64), r["value"].to_numpy(dtype=float),
                                     p, short_ok=True)
            if g is None:
                continue
            g["loop"] = loop
            big = g["growth"] >= p["min_increase_mb"] * MB and g["growth"] >= p["min_increase_ratio"] * g["first"]
            if not big:
                continue
            if g["short"] and not (g["growing"] and g["fit"] >= p["min_fit"]):
                window = (g["t1"] - g["t0"]) / 1e9
                unjudged.append(
                    f"{rank_label(rank, process)}{_in_loop(g)}: host memory grew {g['growth'] / MB:.0f} MB in "
                    f"{window:.1f} s of steady training (steps {g['steps'][0]}-{g['steps'][1]}, "
                    f"{g['samples']} samples), too short to judge a trend (needs {p['min_window_s']:g} s, "
                    f"{100 * p['min_window_share']:g}% of the loop and {steady.MIN_WINDOW_SAMPLES} samples), "
                    f"and not by a similar amount every step (a line over the steps explains "
                    f"{100 * g['fit']:.0f}% of it, under {100 * p['min_fit']:g}%)")
                continue
            if g["growing"]:
                found.append((process, rank, g))
        return found, unjudged

    def _findings(self, run, p, found):
        nodes = node_of(run)
        # the machine runs out when all of its growing ranks together have used its free memory
        node_rate = defaultdict(float)
        for process, _, g in found:
            node_rate[nodes.get(str(process), "")] += g["rate_per_s"]
        out = []
        for process, rank, g in found:
            node = nodes.get(str(process), "")
            free = free_memory(run.system, node, g["t1"])
            left = steady.until_full(free, node_rate[node])
            others = " with the host's other growing ranks" if node_rate[node] > g["rate_per_s"] else ""
            runs_out = (f"; at that rate{others} the host's {free / 2**30:.1f} GiB of free memory is used up in "
                        f"{steady.duration_text(left)}" if left is not None else "")
            steady_ev = steady.evidence_of(g, MB)  # the rate the message states is the evidence's
            growth = f"still grows {steady_ev['rate_mb_per_min']:.0f} MB/min{runs_out}"
            if g["short"]:  # a leak by its steps: no rate in time, no time to run out, from a short window
                left = None
                growth = (f"grew by a similar amount every step ({g['late_per_step'] / MB:.1f} MB a step; a line "
                          f"over the steps explains {100 * g['fit']:.0f}% of it; too short a run to say when "
                          f"memory would run out)")
            warm = (f"after a warm-up of {g['warmup']} steps" if g["warmup"] else "from the first step")
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)}{_in_loop(g)}: host memory grew from {g['first'] / MB:.0f} MB to "
                         f"{g['last'] / MB:.0f} MB during training, {warm} to the end (steps {g['steps'][0]}-"
                         f"{g['steps'][1]}), and {growth}"),
                recommendation=("Something keeps references across steps: a list of losses or outputs that "
                                "still hold tensors (store loss.item() instead), caches without a bound, "
                                "growing logs. Left alone it ends in an out-of-memory kill."),
                evidence={"process": str(process), "loop": g["loop"], "rss_start_mb": round(g["first"] / MB, 1),
                          "rss_end_mb": round(g["last"] / MB, 1), "growth_mb": round(g["growth"] / MB, 1),
                          **steady_ev,
                          "host_free_mb": round(free / MB, 1) if np.isfinite(free) else None,
                          "host_rate_mb_per_min": round(node_rate[node] * 60 / MB, 1),
                          "time_to_full_s": round(left, 1) if left is not None else None}))
        return out


def _replaced_children(kids) -> set:
    """The processes whose child processes were replaced while sampled: more distinct children
    over the run than were ever alive at once."""
    out = set()
    for process, g in kids.groupby("process", sort=False):
        if g["device"].nunique() > g.groupby("timestamp_ns")["device"].nunique().max():
            out.add(process)
    return out
