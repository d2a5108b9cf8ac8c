"""LowGPUUtilization: a GPU idles through much of the loop, and no host resource explains it;
or its utilization swings between busy and idle (SageMaker Debugger's fluctuation test)."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.rules.base import Finding, Param, clean_rank
from stepscope.analysis.rules.gpudata import node_of, samples_of, train_steps
from stepscope.analysis.rules.utilization import LowGPUCause, idle_ms_per_step
from stepscope.analysis.rules.windows import COMMON, loop_windows

MIN_SAMPLES = 10  # fewer NVML samples in a window make its p5 and p95 the same few readings


class LowGPUUtilization(LowGPUCause):
    name = "LowGPUUtilization"
    summary = ("A GPU is below the utilization threshold for much of the training loop while the host is neither "
               "CPU-bound, waiting on I/O, nor leaving room for a larger batch (those windows go to "
               "CPUBottleneck, IOBottleneck and BatchSize, at their default thresholds); or, SageMaker Debugger's "
               "fluctuation test, its NVML samples within a window reach `fluctuation_p95` at the 95th percentile "
               "and fall to `fluctuation_p5` at the 5th (busy bursts between idle gaps) in windows covering "
               "`min_share` of the loop (windows with fewer than 10 samples are not judged).")
    params = {**COMMON,
              "fluctuation_p95": Param(70.0, "%", "fluctuation: the window's 95th percentile of utilization is at "
                                                  "least this (the GPU does get busy; Debugger's threshold_p95)..."),
              "fluctuation_p5": Param(10.0, "%", "...and its 5th percentile at most this (and idles between: "
                                                 "Debugger's threshold_p5)")}
    cause = "idle"

    def describe(self, where, share, m, p, framework):
        message = (f"{where} is underused: {m['gpu_util']:.0f}% utilization (under {p['gpu_threshold']:g}%) through "
                   f"{100 * share:.0f}% of the training loop, with the host CPU not saturated and no I/O wait")
        recommendation = ("The GPU waits for something other than the host CPU or disk: check GetNext's share of "
                          "the step (data from remote storage or the network), per-step host work between "
                          "phases (logging, checkpointing, .item() synchronizations: see HostSyncStall), "
                          "collective communication with slower ranks (LoadBalancing), or many tiny kernels "
                          "(KernelLaunchBound). The timeline of the low windows shows where the gaps are.")
        return message, recommendation

    def evaluate(self, run, p):
        return super().evaluate(run, p) + self._fluctuation(run, p)

    def _fluctuation(self, run, p):
        w = loop_windows(run, p["window_s"], p["warmup_steps"])
        if w.empty:
            return []
        util = samples_of(run, "gpu_util")
        out = []
        for (node, gpu), g in w.groupby(["node", "gpu"], sort=True):
            samples = util[(util["node"] == node) & (util["device"] == gpu)]
            t, v = samples["timestamp_ns"].to_numpy(), samples["value"].to_numpy(dtype=float)
            order = np.argsort(t, kind="stable")  # (the samples of a window, in their order: a slice)
            t, v = t[order], v[order]
            lo = np.searchsorted(t, g["start_ns"].to_numpy(), side="left")
            hi = np.searchsorted(t, g["end_ns"].to_numpy(), side="left")
            low, high = window_percentiles(v, lo, hi, MIN_SAMPLES)
            judged, swinging = 0.0, []
            for r, a, b, p5, p95 in zip(g.itertuples(), lo, hi, low, high):
                inside = v[a:b]
                if len(inside) < MIN_SAMPLES:
                    continue
                seconds = (r.end_ns - r.start_ns) / 1e9
                judged += seconds
                if p95 >= p["fluctuation_p95"] and p5 <= p["fluctuation_p5"]:
                    swinging.append({"window": int(r.window), "seconds": round(seconds, 3),
                                     "p5": round(float(p5), 1), "p95": round(float(p95), 1),
                                     "mean": round(float(inside.mean()), 1)})
            share = sum(s["seconds"] for s in swinging) / judged if judged else 0.0
            if not swinging or share < p["min_share"]:
                continue
            rank = clean_rank(g["rank"].iloc[0])
            p5 = float(np.median([s["p5"] for s in swinging]))
            p95 = float(np.median([s["p95"] for s in swinging]))
            mean = float(np.average([s["mean"] for s in swinging], weights=[s["seconds"] for s in swinging]))
            steps = train_steps(run, p["warmup_steps"])
            steps = steps[steps["process"].map(node_of(run)) == node]
            out.append(Finding(
                rule=self.name, rank=rank, severity="warning",
                message=(f"{gpu} on {node} swings between busy and idle: utilization p95 {p95:.0f}% and p5 "
                         f"{p5:.0f}% within windows covering {100 * share:.0f}% of the training loop"),
                recommendation=("The GPU works in bursts and waits between them: overlap the host's work with the "
                                "GPU's (prefetch the next batch, copy it with pin_memory=True and "
                                "non_blocking=True), avoid synchronizations in the step (HostSyncStall), and look "
                                "at the idle gaps in the timeline for the host work that fills them."),
                evidence={"node": node, "gpu": gpu, "rank": rank, "test": "fluctuation",
                          "share_of_loop": round(share, 3), "window_s": p["window_s"],
                          "thresholds": {"fluctuation_p95": p["fluctuation_p95"],
                                         "fluctuation_p5": p["fluctuation_p5"]},
                          "windows": swinging[:20]},
                cost_ms_per_step=idle_ms_per_step(share, mean, steps)))
        return out


def window_percentiles(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, at_least: int):
    """(p5, p95) of ``values[lo:hi]`` for each window with ``at_least`` values (NaN for the
    others): ``np.percentile`` on each window, called once for all the windows of a size
    (a long run has thousands of windows, nearly all of one size)."""
    p5, p95 = np.full(len(lo), np.nan), np.full(len(lo), np.nan)
    counts = hi - lo
    for n in np.unique(counts[counts >= at_least]):
        rows = np.flatnonzero(counts == n)
        p5[rows], p95[rows] = np.percentile(values[lo[rows, None] + np.arange(n)], [5, 95], axis=1)
    return p5, p95
