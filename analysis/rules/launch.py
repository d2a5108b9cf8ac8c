"""KernelLaunchBound: the GPU idles between many short kernels, waiting for the host
to launch the next one."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.gpudata import compute_kernels, no_gpu_reason, train_steps, union_busy_ns


LAUNCH_SLACK_NS = 20_000


class KernelLaunchBound(Rule):
    name = "KernelLaunchBound"
    summary = ("In train steps the GPU is busy for a small share of the step, running many short kernels, and "
               "its idle time is mostly short gaps in which the next kernel had not been launched yet.")
    params = {
        "max_busy_ratio": Param(0.5, "ratio", "fire when kernel busy time / step time is below this (the GPU idles more than it works)..."),
        "min_kernels_per_step": Param(50, "kernels", "...with at least this many kernels per step (median; a small model's eager step launches hundreds, a few large GEMMs are not launch bound)..."),
        "max_kernel_ms": Param(0.05, "ms", "...whose median duration is below this (a PyTorch eager op costs "
                                           "the host some 10-50 us to launch: shorter kernels cannot be fed)..."),
        "max_gap_ms": Param(0.2, "ms", "an idle gap between two kernels of a step is a launch gap when it is "
                                       "shorter than this (a few launch overheads; longer gaps are host work, "
                                       "not launching) and the second kernel was launched after the GPU went "
                                       "idle..."),
        "min_launch_share": Param(0.5, "ratio", "...and fire when launch gaps are at least this share of the "
                                                "step time the GPU spends idle between its kernels (most of it)"),
        "warmup_steps": Param(2, "steps", "first train steps of each process left out"),
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        return no_gpu_reason(run, "trace")

    def evaluate(self, run, p):
        steps = train_steps(run, p["warmup_steps"])
        k = run.kernels
        k = k[(k["mode"] == "train") & compute_kernels(k)]
        out = []
        for (process, device), kd in k.groupby(["process", "device"], sort=True):
            s = steps[steps["process"] == process]
            kd = kd[kd["step"].isin(set(s["step"]))]
            if kd.empty or s.empty:
                continue
            s = s[s["step"].isin(set(kd["step"]))]
            step_ns = float(s["duration_ns"].sum())
            busy = union_busy_ns(kd["step"].to_numpy(), kd["start_ns"].to_numpy(), kd["end_ns"].to_numpy())
            busy_ratio = float(busy.sum()) / step_ns
            per_step = kd.groupby("step").size()
            kernels_per_step = float(per_step.median())
            kernel_ms = float(kd["duration_ns"].median()) / 1e6
            gaps = _launch_gaps(kd, p["max_gap_ms"] * 1e6)
            between = float(gaps["gap_ns"].sum())
            launch_ns = float(gaps.loc[gaps["launch_gap"], "gap_ns"].sum())
            launch_share = launch_ns / between if between > 0 else 0.0
            if not (busy_ratio < p["max_busy_ratio"] and kernels_per_step >= p["min_kernels_per_step"]
                    and kernel_ms < p["max_kernel_ms"] and launch_share >= p["min_launch_share"]):
                continue
            rank = s["rank"].iloc[0]
            phases = gaps[gaps["launch_gap"]].groupby("phase", dropna=False)["gap_ns"].sum().sort_values(ascending=False)
            by_phase = {str(ph) if ph == ph and ph is not None else "Other": round(v / 1e6 / len(s), 3)
                        for ph, v in phases.items()}
            latency = kd["launch_latency_ns"].dropna()
            lg = gaps.loc[gaps["launch_gap"], "gap_ns"]
            top = kd["name"].value_counts().head(5)
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)}, GPU {device}: kernel launch bound - the GPU is busy "
                         f"{100 * busy_ratio:.0f}% of each train step, running {kernels_per_step:.0f} kernels of "
                         f"{1000 * kernel_ms:.0f} us (median), and {100 * launch_share:.0f}% of its idle time "
                         f"between kernels is spent waiting for the next launch"
                         + (f" (mostly in {next(iter(by_phase))})" if by_phase else "")),
                recommendation=("The host cannot launch kernels as fast as the GPU runs them. Capture the step in "
                                "a CUDA graph (torch.compile(model, mode=\"reduce-overhead\"), or "
                                "torch.cuda.CUDAGraph), fuse small operations (torch.compile, fused/foreach "
                                "optimizers such as Adam(fused=True), fused layers), or give each kernel more "
                                "work with a larger batch."),
                evidence={"process": str(process), "device": int(device), "steps": int(len(s)),
                          "step_range": [int(s["step"].min()), int(s["step"].max())],
                          "busy_ratio": round(busy_ratio, 4), "kernels_per_step": kernels_per_step,
                          "kernel_us_median": round(1000 * kernel_ms, 2),
                          "launch_gap_share": round(launch_share, 4),
                          "launch_gap_us_median": round(float(lg.median()) / 1e3, 2) if len(lg) else None,
                          "launch_latency_us_median": round(float(latency.median()) / 1e3, 2) if len(latency) else None,
                          "step_ms_mean": round(step_ns / len(s) / 1e6, 3),
                          "launch_gap_ms_per_step_by_phase": by_phase,
                          "most_launched": {str(n): int(c) for n, c in top.items()}},
                cost_ms_per_step=launch_ns / len(s) / 1e6))
        return out


def _launch_gaps(kd: pd.DataFrame, max_gap_ns: float) -> pd.DataFrame:
    """Idle gaps between consecutive kernels of a step (on one device): gap_ns, the
    phase that launched the kernel after the gap, and whether the gap waited for that
    launch (short, and launched only once the GPU had nothing left to run)."""
    kd = kd.sort_values(["step", "start_ns"], kind="stable")
    step = kd["step"].to_numpy()
    start = kd["start_ns"].to_numpy(dtype=np.int64)
    reach = pd.Series(kd["end_ns"].to_numpy(dtype=np.int64)).groupby(step).cummax().groupby(step).shift(1)
    has_prev = reach.notna().to_numpy()
    reach = reach.fillna(0).to_numpy(dtype=np.int64)
    gap = np.where(has_prev, np.clip(start - reach, 0, None), 0)
    launched = kd["launch_start_ns"].to_numpy(dtype=float, na_value=np.nan)
    # the launch call began after (or just before: it takes microseconds to reach the GPU) the GPU ran dry
    waited = (launched >= reach - LAUNCH_SLACK_NS) & (gap > 0) & (gap < max_gap_ns)
    return pd.DataFrame({"gap_ns": gap, "phase": kd["phase"].to_numpy(), "launch_gap": waited & has_prev})
