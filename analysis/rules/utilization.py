"""The common shape of LowGPUUtilization, CPUBottleneck, IOBottleneck and BatchSize:
low-GPU windows of one cause (windows.py) covering enough of a GPU's training loop."""

from __future__ import annotations

from typing import ClassVar, Dict, List

import numpy as np

from stepscope.analysis.rules.advice import framework_of
from stepscope.analysis.rules.base import Finding, Rule, clean_rank
from stepscope.analysis.rules.gpudata import no_gpu_reason, node_of, train_steps
from stepscope.analysis.rules.windows import DEFAULTS, causes, loop_windows, window_evidence


class LowGPUCause(Rule):
    """Subclasses set ``cause`` (see windows.causes), ``needs`` (system metrics) and
    implement ``describe(where, share, means) -> (message, recommendation)``."""

    cause: ClassVar[str]
    needs: ClassVar[Dict[str, str]] = {}  # system metric -> what is missing without it

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        reason = no_gpu_reason(run, "metrics")
        if reason:
            return reason
        metrics = set(run.system["metric"].unique())
        for metric, what in self.needs.items():
            if metric not in metrics:
                return f"no {what} samples ({metric})"
        return None

    def describe(self, where: str, share: float, m: dict, p: dict, framework: str):
        """(message, recommendation); framework: advice.TORCH, TENSORFLOW or GENERIC."""
        raise NotImplementedError

    def evaluate(self, run, p) -> List[Finding]:
        w = loop_windows(run, p["window_s"], p["warmup_steps"])
        if w.empty:
            return []
        thresholds = {k: p.get(k, v) for k, v in DEFAULTS.items()}
        w["cause"] = causes(w, thresholds)
        w["seconds"] = (w["end_ns"] - w["start_ns"]) / 1e9
        steps = train_steps(run, p["warmup_steps"])
        steps = steps.assign(node=steps["process"].map(node_of(run)))
        out = []
        framework = framework_of(run)
        for (node, gpu), g in w.groupby(["node", "gpu"], sort=True):
            measured = g[g["gpu_util"].notna()]
            mine = measured[measured["cause"] == self.cause]
            total = measured["seconds"].sum()
            if total <= 0 or mine.empty:
                continue
            share = float(mine["seconds"].sum() / total)
            if share < p["min_share"]:
                continue
            m = {col: float(np.average(mine[col], weights=mine["seconds"]))
                 for col in ("gpu_util", "gpu_memory_percent", "cpu_util", "cpu_iowait", "process_cpu",
                             "process_tree_cpu", "busiest_core", "disk_read_bytes_per_s")
                 if mine[col].notna().all()}
            m["gpu_util_loop"] = float(np.average(measured["gpu_util"], weights=measured["seconds"]))
            where = f"{gpu} on {node}"
            message, recommendation = self.describe(where, share, m, p, framework)
            rank = clean_rank(g["rank"].iloc[0])
            cost = idle_ms_per_step(share, m["gpu_util"], steps[steps["node"] == node])
            out.append(Finding(
                rule=self.name, rank=rank, severity="warning", message=message, recommendation=recommendation,
                evidence={"node": node, "gpu": gpu, "rank": rank, "share_of_loop": round(share, 3),
                          "loop_s": round(total, 3), "window_s": p["window_s"], "windows": int(len(mine)),
                          "windows_judged": int(len(measured)), "framework": framework,
                          "means": {k: round(v, 1) for k, v in m.items()},
                          "thresholds": {k: thresholds[k] for k in thresholds},
                          "low_windows": window_evidence(mine, steps)},
                cost_ms_per_step=cost))
        return out


def idle_ms_per_step(share: float, gpu_util: float, steps) -> float:
    """What a GPU's low windows cost: the time it idles in them, per train step of the loop
    (their share of the loop x the idle share of their time x the mean step)."""
    if not len(steps):
        return float("nan")
    return share * (1 - gpu_util / 100) * float(steps["duration_ns"].mean()) / 1e6
