"""GPUMemoryIncrease: a GPU's used memory keeps growing through the training loop, after its
warm-up (analysis/rules/steady.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.rules import steady
from stepscope.analysis.rules.base import Finding, Param, Rule
from stepscope.analysis.rules.gpudata import node_of, samples_of
from stepscope.analysis.rules.memory import MB
from stepscope.analysis.rules.windows import _rank_of_gpu
from stepscope.analysis.store.frames import as_strings


class GPUMemoryIncrease(Rule):
    name = "GPUMemoryIncrease"
    summary = ("A GPU's used memory (NVML) keeps rising after the warm-up, through the later part of the training "
               "loop (the steady state: see below), not in the one-off steps of the caching allocator warming up.")
    params = {
        "min_increase_percent": Param(5.0, "%", "fire when used memory grows in the steady state by more than "
                                                "this share of the GPU's total (SageMaker Debugger's "
                                                "GPUMemoryIncrease: 5%)..."),
        "min_increase_ratio": Param(0.10, "ratio", "...and by more than this fraction of its value when the steady "
                                                   "state begins (as HostMemoryIncrease)"),
        "min_trend": Param(0.8, "ratio", "rank correlation of used memory with time, over the steady state and over "
                                         "its later half: growth that goes on, not one jump (as HostMemoryIncrease)"),
        "window_share": Param(0.2, "ratio", "compare the medians of the first and last this share of the steady "
                                            "state (as HostMemoryIncrease)"),
        **steady.PARAMS,
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        if not len(samples_of(run, "gpu_memory_used")):
            return "no GPU memory samples (NVML; needs a GPU host with --gpu metrics or trace)"
        return None

    def evaluate(self, run, p):
        train = run.steps[run.steps["mode"] == "train"]
        nodes = node_of(run)
        train = train.assign(node=pd.Series(as_strings(train["process"]), index=train.index).map(nodes))
        used = samples_of(run, "gpu_memory_used")
        total = samples_of(run, "gpu_memory_total")
        out = []
        for node, s in train.groupby("node", sort=True):
            local = run.processes[(run.processes["host"].astype(str) == node)
                                  & run.processes["process"].isin(set(as_strings(s["process"])))]
            here = used[used["node"] == node]
            for gpu, g in here.groupby("device", sort=True):
                rank = _rank_of_gpu(local, gpu)
                g = g.sort_values("timestamp_ns")
                judged = steady.steady_growth(_loop_of(s, local, rank), g["timestamp_ns"].to_numpy(np.int64),
                                              g["value"].to_numpy(dtype=float), p)
                if judged is None or not judged["growing"]:
                    continue
                first, last, growth = judged["first"], judged["last"], judged["growth"]
                cap = total[(total["node"] == node) & (total["device"] == gpu)]["value"]
                capacity = float(cap.max()) if len(cap) else np.nan
                if not (growth > p["min_increase_percent"] / 100 * capacity
                        and growth > p["min_increase_ratio"] * first):
                    continue
                left = steady.until_full(capacity - judged["last_value"], judged["rate_per_s"])
                runs_out = (f"; at that rate its free {(capacity - judged['last_value']) / MB:.0f} MB are used up "
                            f"in {steady.duration_text(left)}" if left is not None else "")
                warm = (f"after a warm-up of {judged['warmup']} steps" if judged["warmup"] else "from the first step")
                steady_ev = steady.evidence_of(judged, MB)  # the rate the message states is the evidence's
                out.append(Finding(
                    rule=self.name, rank=rank, severity="warning",
                    message=(f"{gpu} on {node}: used memory grew from {first / MB:.0f} MB to {last / MB:.0f} MB "
                             f"({100 * growth / capacity:.0f}% of its {capacity / MB:.0f} MB) during training, "
                             f"{warm} to the end (steps {judged['steps'][0]}-{judged['steps'][1]}), and is still "
                             f"growing {steady_ev['rate_mb_per_min']:.0f} MB/min{runs_out}"),
                    recommendation=("Tensors that stay referenced across steps: accumulating the loss or outputs "
                                    "with their graph (total += loss; use loss.item() or loss.detach()), lists of "
                                    "predictions kept on the GPU (move them to the CPU), caches keyed by input "
                                    "shape, or gradients of parameters that are never zeroed. It ends in CUDA out "
                                    "of memory; torch.cuda.memory._record_memory_history() shows who allocates."),
                    evidence={"node": node, "gpu": gpu, "used_start_mb": round(first / MB, 1),
                              "used_end_mb": round(last / MB, 1), "growth_mb": round(growth / MB, 1),
                              "growth_percent_of_total": round(100 * growth / capacity, 2),
                              **steady_ev,
                              "free_mb": round((capacity - judged["last_value"]) / MB, 1),
                              "time_to_full_s": round(left, 1) if left is not None else None}))
        return out


def _loop_of(steps, local, rank):
    """The train steps the GPU's memory is judged over: those of the rank driving it, else
    of the node's process with the most train steps."""
    if rank is not None:
        procs = set(local.loc[local["rank"] == rank, "process"].astype(str))
        mine = steps[np.isin(as_strings(steps["process"]), list(procs))]
        if len(mine):
            return mine
    names = as_strings(steps["process"])
    counts = pd.Series(names).value_counts()
    return steps[names == counts.index[0]]
