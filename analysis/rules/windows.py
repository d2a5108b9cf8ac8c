"""Time windows over a node's training loop, with what its GPUs and its host did in
each: the data of LowGPUUtilization, CPUBottleneck, IOBottleneck and BatchSize.

A node's loop runs from the first to the last train step of its processes (after
warm-up) and is cut into equal windows of about ``window_s`` seconds (one window
when the loop is shorter). Each window holds sample means, so the rules' thresholds
mean the same at any sampling interval. A low-GPU window gets one cause, checked
in this order so the four rules split the same time and never report it twice:

- ``cpu``: the host CPU is busy - every core of the node on average
  (aggregate ``cpu_util``), or the training process itself (its own
  ``proc_cpu_percent``, the loop's thread and the threads it starts). One busy
  core among many idle ones is not enough: per-core figures are evidence only.
- ``io``: the CPUs wait for I/O more than they work (``cpu_iowait`` against
  ``cpu_util``: a share independent of the number of cores).
- ``batch``: CPU and GPU memory have room to spare: a larger batch would fit.
- ``idle``: none of these; the GPU waits for something else.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.rules.base import Param
from stepscope.analysis.rules.gpudata import memo, node_of, train_steps

# Shared parameters: one definition, so the four rules read the same way.
GPU_THRESHOLD = Param(50.0, "%", "a window is low when its GPU's mean NVML utilization (share of time a kernel "
                                 "ran) is below this: the GPU idles more than it works. SageMaker Debugger used "
                                 "70% at p95 for LowGPUUtilization and 10% for its CPU/IO rules; one value lets "
                                 "the four rules split the same low-GPU time")
WINDOW_S = Param(5.0, "s", "length of the time windows the loop is cut into (one window for a shorter loop); "
                           "long enough to average NVML's samples, short enough to catch a phase of the run")
MIN_SHARE = Param(0.3, "ratio", "fire when the windows of this cause cover at least this share of the loop: a "
                                "sustained pattern, not a passing evaluation or checkpoint")
WARMUP_STEPS = Param(2, "steps", "first train steps of each process left out (allocation, compilation, workers "
                                 "starting)")
CPU_BUSY = Param(90.0, "%", "the host is CPU-bound when all cores together, or the training process (% of one "
                            "core), are at least this busy (SageMaker Debugger's CPUBottleneck used 90%)")
IOWAIT_RATIO = Param(0.5, "ratio", "the host waits on I/O when iowait / (busy + iowait) CPU time reaches this: "
                                   "the CPUs wait for storage more than they compute")
MIN_IOWAIT = Param(1.0, "%", "...and iowait is at least this share of all CPU time (ignores an idle host's "
                             "noise)")
BATCH_CPU = Param(70.0, "%", "a larger batch needs host headroom: all cores and the training process below "
                             "this (SageMaker Debugger's BatchSize: 70% at p95)")
BATCH_GPU_MEMORY = Param(50.0, "%", "...and the GPU's used memory (at most, in the window) below this share of its "
                                    "total, so a doubled batch's activations fit. NVML counts PyTorch's cached "
                                    "blocks as used, so this errs on the safe side")

COMMON = {"gpu_threshold": GPU_THRESHOLD, "window_s": WINDOW_S, "min_share": MIN_SHARE, "warmup_steps": WARMUP_STEPS}
DEFAULTS = {"gpu_threshold": GPU_THRESHOLD.default, "cpu_threshold": CPU_BUSY.default,
            "iowait_ratio": IOWAIT_RATIO.default, "min_iowait": MIN_IOWAIT.default,
            "max_cpu": BATCH_CPU.default, "max_gpu_memory": BATCH_GPU_MEMORY.default}


def _window_means(samples: pd.DataFrame, edges: np.ndarray) -> pd.Series:
    """Mean value per window index of samples (timestamp_ns, value) inside the loop."""
    if samples.empty:
        return pd.Series(dtype=float)
    t = samples["timestamp_ns"].to_numpy()
    w = np.searchsorted(edges, t, side="right") - 1
    inside = (w >= 0) & (w < len(edges) - 1)
    return pd.Series(samples["value"].to_numpy(dtype=float)[inside]).groupby(w[inside]).mean()


def loop_windows(run, window_s: float, warmup_steps: float) -> pd.DataFrame:
    """One row per (node, GPU, window): times, steps and the window's means (a copy:
    the rules that read them add columns of their own)."""
    key = ("loop_windows", float(window_s), float(warmup_steps))
    return memo(run, key, lambda: _loop_windows(run, window_s, warmup_steps)).copy()


def _loop_windows(run, window_s: float, warmup_steps: float) -> pd.DataFrame:
    steps = train_steps(run, warmup_steps)
    system = run.system
    if steps.empty or system.empty:
        return pd.DataFrame()
    nodes = node_of(run)
    steps = steps.assign(node=steps["process"].map(nodes))
    procs = run.processes
    rows = []
    for node, s in steps.groupby("node", sort=True):
        t0, t1 = int(s["start_ns"].min()), int(s["end_ns"].max())
        n = max(1, int(round((t1 - t0) / 1e9 / max(window_s, 1e-3))))
        edges = np.linspace(t0, t1, n + 1).astype(np.int64)
        edges[-1] = t1 + 1  # the last sample at the loop's end belongs to the last window
        sysn = system[system["node"] == node]
        by_metric = {m: g for m, g in sysn.groupby("metric", sort=False)}

        def means(metric, device=None, where=None):
            g = by_metric.get(metric, pd.DataFrame(columns=["timestamp_ns", "value", "device", "process"]))
            if device is not None:
                g = g[g["device"] == device]
            if where is not None:
                g = g[where(g)]
            return _window_means(g, edges)

        host = pd.DataFrame(index=pd.RangeIndex(n))
        host["cpu_util"] = means("cpu_util", "all")
        host["cpu_iowait"] = means("cpu_iowait", "all")
        cores = by_metric.get("cpu_util", pd.DataFrame(columns=["device"]))
        cores = cores[cores["device"].astype(str).str.fullmatch(r"cpu\d+")] if len(cores) else cores
        per_core = {c: _window_means(g, edges) for c, g in cores.groupby("device")} if len(cores) else {}
        core_frame = pd.DataFrame(per_core).reindex(host.index)
        host["cores"] = len(per_core)
        host["busiest_core"] = core_frame.max(axis=1) if per_core else np.nan
        host["busy_cores"] = (core_frame >= DEFAULTS["cpu_threshold"]).sum(axis=1) if per_core else np.nan
        # the training processes' own CPU (each process alone, % of one core), and with their workers
        trainers = set(s["process"])
        own = by_metric.get("proc_cpu_percent", pd.DataFrame(columns=["process", "device"]))
        own = own[own["process"].isin(trainers)] if len(own) else own
        if len(own):
            self_cpu = own[own["device"] == "self"]
            host["process_cpu"] = pd.DataFrame(
                {p: _window_means(g, edges) for p, g in self_cpu.groupby("process")}).reindex(host.index).max(axis=1)
            tree = own.groupby(["process", "timestamp_ns"], as_index=False)["value"].sum()
            host["process_tree_cpu"] = pd.DataFrame(
                {p: _window_means(g, edges) for p, g in tree.groupby("process")}).reindex(host.index).sum(axis=1)
        else:
            host["process_cpu"] = host["process_tree_cpu"] = np.nan
        disk = by_metric.get("disk_read_bytes_per_s", pd.DataFrame(columns=["timestamp_ns", "value"]))
        disk = disk.groupby("timestamp_ns", as_index=False)["value"].sum() if len(disk) else disk
        host["disk_read_bytes_per_s"] = _window_means(disk, edges)

        local = procs[procs["host"].astype(str) == node]
        local = local[local["process"].isin(trainers)]
        gpus = sorted(by_metric.get("gpu_util", pd.DataFrame(columns=["device"]))["device"].unique(),
                      key=lambda d: int(str(d)[3:]) if str(d)[3:].isdigit() else 0)
        for gpu in gpus:
            w = host.copy()
            w["gpu_util"] = means("gpu_util", gpu)
            w["gpu_memory_percent"] = _window_max(by_metric.get("gpu_memory_used_percent"), gpu, edges)
            w["node"], w["gpu"], w["window"] = node, gpu, w.index
            w["start_ns"], w["end_ns"] = edges[:-1], np.minimum(edges[1:], t1)
            w["loop_start_ns"], w["loop_end_ns"] = t0, t1
            w["rank"] = _rank_of_gpu(local, gpu)
            rows.append(w)
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True)


def _window_max(samples, gpu, edges) -> pd.Series:
    if samples is None:
        return pd.Series(dtype=float)
    g = samples[samples["device"] == gpu]
    t = g["timestamp_ns"].to_numpy()
    w = np.searchsorted(edges, t, side="right") - 1
    inside = (w >= 0) & (w < len(edges) - 1)
    return pd.Series(g["value"].to_numpy(dtype=float)[inside]).groupby(w[inside]).max()


def _rank_of_gpu(local: pd.DataFrame, gpu: str):
    """The rank driving a GPU: the node's only training process, or the one whose local
    rank is the GPU's index (torchrun's convention); None when unknown."""
    ranks = local["rank"].dropna()
    if len(local) == 1:
        return None if ranks.empty else int(ranks.iloc[0])
    index = int(gpu[3:]) if gpu[3:].isdigit() else -1
    match = local[local["local_rank"] == index]["rank"].dropna()
    return int(match.iloc[0]) if len(match) == 1 else None


def causes(w: pd.DataFrame, t: dict) -> pd.Series:
    """Each window's cause of low GPU utilization ("cpu", "io", "batch", "idle"), or
    None where the GPU is not low or unmeasured. t: thresholds as in DEFAULTS."""
    low = w["gpu_util"] < t["gpu_threshold"]
    cpu_all, own = w["cpu_util"], w["process_cpu"]
    cpu = (cpu_all >= t["cpu_threshold"]) | (own >= t["cpu_threshold"])
    ratio = w["cpu_iowait"] / (w["cpu_util"] + w["cpu_iowait"]).where(lambda x: x > 0)
    io = (ratio >= t["iowait_ratio"]) & (w["cpu_iowait"] >= t["min_iowait"])
    headroom = (cpu_all.fillna(0) < t["max_cpu"]) & (own.fillna(0) < t["max_cpu"]) & cpu_all.notna()
    batch = headroom & (w["gpu_memory_percent"] < t["max_gpu_memory"])
    out = pd.Series(np.where(cpu, "cpu", np.where(io, "io", np.where(batch, "batch", "idle"))), index=w.index,
                    dtype=object)
    return out.where(low & w["gpu_util"].notna(), None)


def steps_between(run_steps: pd.DataFrame, t0: int, t1: int) -> list:
    """[first, last] train step numbers overlapping [t0, t1) (of the first process)."""
    s = run_steps[(run_steps["end_ns"] > t0) & (run_steps["start_ns"] < t1)]
    if s.empty:
        return []
    s = s[s["process"] == s["process"].iloc[0]]
    return [int(s["step"].min()), int(s["step"].max())]


def window_evidence(w: pd.DataFrame, steps: pd.DataFrame, limit: int = 20) -> list:
    out = []
    for r in w.head(limit).itertuples():
        node_steps = steps[steps["node"] == r.node] if "node" in steps else steps
        row = {"window": int(r.window), "start_s": round((r.start_ns - r.loop_start_ns) / 1e9, 3),
               "end_s": round((r.end_ns - r.loop_start_ns) / 1e9, 3),
               "steps": steps_between(node_steps, r.start_ns, r.end_ns)}
        for col in ("gpu_util", "gpu_memory_percent", "cpu_util", "cpu_iowait", "process_cpu", "process_tree_cpu",
                    "busiest_core"):
            v = getattr(r, col)
            if v == v and v is not None:
                row[col] = round(float(v), 1)
        if r.cores:
            row["busy_cores"] = f"{int(r.busy_cores)}/{int(r.cores)}"
        if r.disk_read_bytes_per_s == r.disk_read_bytes_per_s:
            row["disk_read_mb_per_s"] = round(float(r.disk_read_bytes_per_s) / (1 << 20), 1)
        out.append(row)
    return out
