"""LowGPUUtilization: a GPU idles through much of the loop, and no host resource explains it."""

from __future__ import annotations

from stepscope.analysis.rules.utilization import LowGPUCause
from stepscope.analysis.rules.windows import COMMON


class LowGPUUtilization(LowGPUCause):
    name = "LowGPUUtilization"
    summary = ("A GPU is below the utilization threshold for much of the training loop while the host is neither "
               "CPU-bound, waiting on I/O, nor leaving room for a larger batch (those windows go to "
               "CPUBottleneck, IOBottleneck and BatchSize, at their default thresholds).")
    params = dict(COMMON)
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
