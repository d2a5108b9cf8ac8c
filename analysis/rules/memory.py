"""HostMemoryIncrease: a rank's resident memory keeps growing through its training loop."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label

MB = 1 << 20


def _rank_correlation(values: np.ndarray) -> float:
    """Spearman's correlation of values with their order in time (1: always rising)."""
    ranks = pd.Series(values).rank().to_numpy()
    if np.all(ranks == ranks[0]):
        return 0.0
    return float(np.corrcoef(ranks, np.arange(len(values)))[0, 1])


def growth_of(values: np.ndarray, window_share: float):
    """(first, last, trend) of a series in time order: medians of its first and last
    window_share, and its rank correlation with time."""
    k = max(2, int(len(values) * window_share))
    return float(np.median(values[:k])), float(np.median(values[-k:])), _rank_correlation(values)


class HostMemoryIncrease(Rule):
    name = "HostMemoryIncrease"
    summary = "Host RSS of a rank (with its DataLoader workers) rises steadily during training."
    params = {
        "min_increase_mb": Param(200, "MB", "fire when RSS grows by more than this..."),
        "min_increase_ratio": Param(0.10, "ratio", "...and by more than this fraction of its starting value"),
        "min_trend": Param(0.8, "ratio", "rank correlation of RSS with time: steady growth, not one spike"),
        "window_share": Param(0.2, "ratio", "compare the first and last this share of the loop"),
    }

    def not_applicable(self, run):
        if not len(run.steps):
            return "no steps"
        if not (run.system["metric"] == "proc_rss").any():
            return "no process memory samples"
        return None

    def evaluate(self, run, p):
        out = []
        rss = run.system[run.system["metric"] == "proc_rss"]
        # a rank and its children, summed per sample
        total = rss.groupby(["process", "timestamp_ns"], as_index=False)["value"].sum()
        for (process, rank), s in run.steps.groupby(["process", "rank"], dropna=False, sort=True):
            t0, t1 = int(s["start_ns"].min()), int(s["end_ns"].max())
            r = total[(total["process"] == process) & (total["timestamp_ns"] >= t0) & (total["timestamp_ns"] <= t1)]
            if len(r) < 8:
                continue
            r = r.sort_values("timestamp_ns")
            first, last, trend = growth_of(r["value"].to_numpy(dtype=float), p["window_share"])
            growth = last - first
            if growth < p["min_increase_mb"] * MB or growth < p["min_increase_ratio"] * first or trend < p["min_trend"]:
                continue
            minutes = (t1 - t0) / 60e9
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)}: host memory grew from {first / MB:.0f} MB to "
                         f"{last / MB:.0f} MB during training ({growth / MB / max(minutes, 1e-9):.0f} MB/min)"),
                recommendation=("Something keeps references across steps: a list of losses or outputs that "
                                "still hold tensors (store loss.item() instead), caches without a bound, "
                                "growing logs. Left alone it ends in an out-of-memory kill."),
                evidence={"process": str(process), "rss_start_mb": round(first / MB, 1),
                          "rss_end_mb": round(last / MB, 1), "growth_mb": round(growth / MB, 1),
                          "trend": round(trend, 3), "samples": int(len(r)),
                          "window_s": round((t1 - t0) / 1e9, 3)}))
        return out
