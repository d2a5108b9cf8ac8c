"""Whole-loop overhead on real PyTorch training: stepscope vs no profiler vs torch.profiler.

    python3 bench/overhead.py [--rounds 7]

An 8-layer MLP (width 64: ~1 ms steps; width 1024: ~45 ms steps on the
development VM), one torch thread, a DataLoader over in-memory tensors, SGD.
Three configurations run in one process, interleaved round by round; each
figure is the median over rounds of a configuration's loop time divided by the
no-profiler loop of the same round (the VM's speed drifts by ±20% over
seconds; pairing cancels that):

* none: no profiler;
* stepscope: what ``STEPSCOPE=1`` does (``integrations.torch.instrument()`` and a
  running session; every step split into phases);
* torch.profiler: ``profile(activities=[CPU])`` around the loop, every step.

Only the loop is timed; start/stop and torch.profiler's post-processing are
once per job.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, TensorDataset

import stepscope
from stepscope.integrations import torch as st_torch


def make(width: int, batch: int):
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    data = TensorDataset(torch.randn(batch * 8, width), torch.randn(batch * 8, width))
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    def loop(steps: int):
        done = 0
        while done < steps:
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                done += 1
                if done == steps:
                    break

    return loop


def measure(width: int, batch: int, steps: int, rounds: int, tmp: str) -> dict:
    """Median over rounds of each configuration's time relative to the no-profiler
    chunk of the same round: pairing cancels the VM's slow drifts in speed."""
    loop = make(width, batch)
    loop(10)  # warm up allocator and kernels

    def timed(warmup=5):
        loop(warmup)  # stepscope's root discovery, the profiler's first steps: once per job
        t = time.perf_counter()
        loop(steps)
        return time.perf_counter() - t

    def none():
        return timed()

    def with_stepscope():
        st_torch.instrument()
        run = stepscope.start(dir=tmp, name=f"overhead-{width}-{time.time_ns()}")
        try:
            return timed()
        finally:
            run.stop()
            st_torch.uninstrument()

    def with_torch_profiler():
        with profile(activities=[ProfilerActivity.CPU]):
            return timed()

    base, ratios = [], {"stepscope": [], "torch.profiler": []}
    for _ in range(rounds):
        t_none = none()
        base.append(t_none)
        ratios["stepscope"].append(with_stepscope() / t_none)
        ratios["torch.profiler"].append(with_torch_profiler() / t_none)
    return {"step_s": statistics.median(base) / steps,
            **{k: statistics.median(v) for k, v in ratios.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {args.rounds} interleaved rounds")
    print("| model | step (no profiler) | stepscope | torch.profiler |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for width, batch, steps in ((64, 128, 60), (1024, 128, 12)):
            m = measure(width, batch, steps, args.rounds, tmp)
            print(f"| 8-layer MLP, width {width}, batch {batch} | {m['step_s'] * 1e3:.2f} ms "
                  f"| {m['stepscope']:.4f}x | {m['torch.profiler']:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
