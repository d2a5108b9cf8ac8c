"""KernelLaunchBound: the GPU idles between many short kernels, waiting for the host
to launch the next one."""

from __future__ import annotations

from stepscope.analysis.tables.kernel_steps import LAUNCH_GAP_NS, aggregate, is_compute
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.gpudata import no_gpu_reason, train_steps


class KernelLaunchBound(Rule):
    name = "KernelLaunchBound"
    summary = ("In train steps the GPU is busy for a small share of the step, running many short kernels, and "
               "its idle time is mostly short gaps in which the next kernel had not been launched yet. It reads "
               "the kernels aggregated per step (`run.kernel_steps`, docs/format.md), so a run of a billion kernels "
               "is judged without holding them: the median kernel duration is the median over steps of each "
               "step's median, `most_launched` counts the kernels of every train step (warm-up included), and a "
               "`max_gap_ms` other than the default aggregates the kernels again from `run.kernels`.")
    params = {
        "max_busy_ratio": Param(0.5, "ratio", "fire when kernel busy time / step time is below this "
                                              "(the GPU idles more than it works)..."),
        "min_kernels_per_step": Param(50, "kernels", "...with at least this many kernels per step (median; a small "
                                                     "model's eager step launches hundreds, a few large GEMMs are "
                                                     "not launch bound)..."),
        "max_kernel_ms": Param(0.05, "ms", "...whose median duration is below this (a PyTorch eager op costs "
                                           "the host some 10-50 us to launch: shorter kernels cannot be fed)..."),
        "max_gap_ms": Param(LAUNCH_GAP_NS / 1e6, "ms", "an idle gap between two kernels of a step is a launch gap "
                                       "when it is shorter than this (a few launch overheads; longer gaps are "
                                       "host work, not launching) and the second kernel was launched after the "
                                       "GPU went idle..."),
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
        max_gap_ns = p["max_gap_ms"] * 1e6
        if abs(max_gap_ns - LAUNCH_GAP_NS) < 1:  # as aggregated when the run was read
            per_step, per_phase, per_name = run.kernel_steps, run.kernel_phases, run.kernel_names
        else:
            tables = aggregate(run.kernels, max_gap_ns)
            per_step, per_phase, per_name = tables["kernel_steps"], tables["kernel_phases"], tables["kernel_names"]
        per_step = per_step[per_step["mode"] == "train"]
        out = []
        for (process, device), kd in per_step.groupby(["process", "device"], sort=True, observed=True):
            s = steps[steps["process"] == process]
            kd = kd[kd["step"].isin(set(s["step"]))]
            if kd.empty or s.empty:
                continue
            s = s[s["step"].isin(set(kd["step"]))]
            step_ns = float(s["duration_ns"].sum())
            busy_ratio = float(kd["busy_ns"].sum()) / step_ns
            kernels_per_step = float(kd["kernels"].median())
            kernel_ms = float(kd["kernel_ns_median"].median()) / 1e6
            between = float(kd["gap_ns"].sum())
            launch_ns = float(kd["launch_gap_ns"].sum())
            launch_share = launch_ns / between if between > 0 else 0.0
            if not (busy_ratio < p["max_busy_ratio"] and kernels_per_step >= p["min_kernels_per_step"]
                    and kernel_ms < p["max_kernel_ms"] and launch_share >= p["min_launch_share"]):
                continue
            rank = s["rank"].iloc[0]
            ph = per_phase[(per_phase["process"] == process) & (per_phase["device"] == device)
                           & (per_phase["mode"] == "train") & per_phase["step"].isin(set(s["step"]))]
            phases = ph.groupby(ph["phase"].fillna("Other"))["launch_gap_ns"].sum()
            phases = phases[phases > 0].sort_values(ascending=False)
            by_phase = {str(ph_): round(v / 1e6 / len(s), 3) for ph_, v in phases.items()}
            names = per_name[(per_name["process"] == process) & (per_name["device"] == device)
                             & (per_name["mode"] == "train")]
            names = names[is_compute(names["name"])]
            top = names.groupby("name")["kernels"].sum().sort_values(ascending=False, kind="stable").head(5)
            gap_median, latency = kd["launch_gap_ns_median"].dropna(), kd["launch_latency_ns_median"].dropna()
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
                          "launch_gap_us_median":
                              round(float(gap_median.median()) / 1e3, 2) if len(gap_median) else None,
                          "launch_latency_us_median":
                              round(float(latency.median()) / 1e3, 2) if len(latency) else None,
                          "step_ms_mean": round(step_ns / len(s) / 1e6, 3),
                          "launch_gap_ms_per_step_by_phase": by_phase,
                          "most_launched": {str(n): int(c) for n, c in top.items()}},
                cost_ms_per_step=launch_ns / len(s) / 1e6))
        return out

