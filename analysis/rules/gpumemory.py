"""GPUMemoryIncrease: a GPU's used memory keeps growing through the training loop."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.rules.base import Finding, Param, Rule
from stepscope.analysis.rules.gpudata import node_of, train_steps
from stepscope.analysis.rules.memory import MB, _rank_correlation, growth_of
from stepscope.analysis.rules.windows import _rank_of_gpu


class GPUMemoryIncrease(Rule):
    name = "GPUMemoryIncrease"
    summary = ("A GPU's used memory (NVML) rises steadily through the training loop, not in the one-off steps "
               "of the caching allocator warming up.")
    params = {
        "min_increase_percent": Param(5.0, "%", "fire when used memory grows by more than this share of the GPU's "
                                                "total (SageMaker Debugger's GPUMemoryIncrease: 5%)..."),
        "min_increase_ratio": Param(0.10, "ratio", "...and by more than this fraction of its starting value (as HostMemoryIncrease)"),
        "min_trend": Param(0.8, "ratio", "rank correlation of used memory with time, in each half of the loop: "
                                         "growth that goes on, not one jump (as for HostMemoryIncrease)"),
        "window_share": Param(0.2, "ratio", "compare the medians of the first and last this share of the loop (as HostMemoryIncrease)"),
        "warmup_steps": Param(2, "steps", "first train steps left out (the allocator reserves its pools and the "
                                          "optimizer its state in the first steps)"),
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        if not (run.system["metric"] == "gpu_memory_used").any():
            return "no GPU memory samples (NVML; needs a GPU host with --gpu metrics or trace)"
        return None

    def evaluate(self, run, p):
        steps = train_steps(run, p["warmup_steps"])
        if steps.empty:
            return []
        nodes = node_of(run)
        steps = steps.assign(node=steps["process"].map(nodes))
        system = run.system
        used = system[system["metric"] == "gpu_memory_used"]
        total = system[system["metric"] == "gpu_memory_total"]
        out = []
        for node, s in steps.groupby("node", sort=True):
            t0, t1 = int(s["start_ns"].min()), int(s["end_ns"].max())
            here = used[(used["node"] == node) & (used["timestamp_ns"] >= t0) & (used["timestamp_ns"] <= t1)]
            for gpu, g in here.groupby("device", sort=True):
                v = g.sort_values("timestamp_ns")["value"].to_numpy(dtype=float)
                if len(v) < 8:
                    continue
                first, last, trend = growth_of(v, p["window_share"])
                half = len(v) // 2
                trend_halves = min(_rank_correlation(v[:half]), _rank_correlation(v[half:]))
                cap = total[(total["node"] == node) & (total["device"] == gpu)]["value"]
                capacity = float(cap.max()) if len(cap) else np.nan
                growth = last - first
                if not (growth > p["min_increase_percent"] / 100 * capacity and growth > p["min_increase_ratio"] * first
                        and trend >= p["min_trend"] and trend_halves >= p["min_trend"]):
                    continue
                minutes = (t1 - t0) / 60e9
                local = run.processes[(run.processes["host"].astype(str) == node)
                                      & run.processes["process"].isin(set(s["process"]))]
                rank = _rank_of_gpu(local, gpu)
                out.append(Finding(
                    rule=self.name, rank=rank, severity="warning",
                    message=(f"{gpu} on {node}: used memory grew from {first / MB:.0f} MB to {last / MB:.0f} MB "
                             f"({100 * growth / capacity:.0f}% of its {capacity / MB:.0f} MB) during training, "
                             f"{growth / MB / max(minutes, 1e-9):.0f} MB/min, and is still growing"),
                    recommendation=("Tensors that stay referenced across steps: accumulating the loss or outputs "
                                    "with their graph (total += loss; use loss.item() or loss.detach()), lists of "
                                    "predictions kept on the GPU (move them to the CPU), caches keyed by input "
                                    "shape, or gradients of parameters that are never zeroed. It ends in CUDA out "
                                    "of memory; torch.cuda.memory._record_memory_history() shows who allocates."),
                    evidence={"node": node, "gpu": gpu, "used_start_mb": round(first / MB, 1),
                              "used_end_mb": round(last / MB, 1), "growth_mb": round(growth / MB, 1),
                              "growth_percent_of_total": round(100 * growth / capacity, 2),
                              "trend": round(trend, 3), "trend_halves": round(trend_halves, 3),
                              "samples": int(len(v)), "window_s": round((t1 - t0) / 1e9, 3),
                              "steps": [int(s["step"].min()), int(s["step"].max())]}))
        return out
