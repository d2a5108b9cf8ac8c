"""LoadBalancing: in synchronous data parallelism the ranks wait for the slowest one."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank


class LoadBalancing(Rule):
    name = "LoadBalancing"
    summary = "One rank does more work per step; the others wait for it in the gradient all-reduce."
    params = {
        "threshold_ratio": Param(0.10, "ratio", "fire when the slow rank's extra work per step exceeds this "
                                                "share of the median step time..."),
        "min_ms": Param(5.0, "ms", "...and this many milliseconds"),
        "warmup_steps": Param(2, "steps", "first train steps left out"),
    }

    def not_applicable(self, run):
        train = run.steps[run.steps["mode"] == "train"]
        if train["rank"].dropna().nunique() < 2:
            return "fewer than two ranks with train steps"
        return None

    def evaluate(self, run, p):
        # Fast ranks wait for the slow one inside Backward (DDP's all-reduce runs in
        # backward hooks), so a rank's own work per step is its step time outside
        # Backward: the rank with the most is the one the others wait for.
        train = run.steps[(run.steps["mode"] == "train") & run.steps["rank"].notna()]
        per_rank = {}
        for (process, rank), s in train.groupby(["process", "rank"], sort=True):
            s = s.sort_values("start_ns").iloc[int(p["warmup_steps"]):]
            if len(s):
                work = (s["duration_ns"] - s["Backward"]).to_numpy(dtype=float)
                per_rank[int(rank)] = (float(np.median(work)), process, float(s["duration_ns"].median()))
        if len(per_rank) < 2:
            return []
        slow = max(per_rank, key=lambda r: per_rank[r][0])
        others = [v[0] for r, v in per_rank.items() if r != slow]
        extra = per_rank[slow][0] - float(np.median(others))
        step_ms = float(np.median([v[2] for v in per_rank.values()])) / 1e6
        if extra / 1e6 <= max(p["min_ms"], p["threshold_ratio"] * step_ms):
            return []
        return [Finding(
            rule=self.name, rank=clean_rank(slow), severity="warning",
            message=(f"rank {slow} is the straggler: it works {extra / 1e6:.1f} ms longer per step outside "
                     f"the gradient all-reduce, and the other {len(others)} rank(s) wait for it in Backward "
                     f"({100 * extra / 1e6 / step_ms:.0f}% of a {step_ms:.1f} ms step)"),
            recommendation=(f"Even out the work: look at what rank {slow} does that the others do not (extra "
                            "logging or evaluation on one rank, uneven batch sizes or sequence lengths, a slower "
                            "device or host, data loading on a busy node)."),
            evidence={"slow_rank": slow, "extra_ms_per_step": round(extra / 1e6, 3), "step_ms_median": round(step_ms, 3),
                      "work_outside_backward_ms": {str(r): round(v[0] / 1e6, 3) for r, v in sorted(per_rank.items())}})]
