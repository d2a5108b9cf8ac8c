"""Whole-loop overhead on real PyTorch training: stepscope vs no profiler vs torch.profiler.

    python3 bench/overhead.py [--rounds 7]

An 8-layer MLP (width 64: ~1 ms steps; width 1024: ~45 ms steps on the
development VM), one torch thread, a DataLoader over in-memory tensors, SGD.
Three configurations run in one process, interleaved round by round; each
figure is the median over rounds of the loop's wall time:

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


def make(width: int, batch: int, steps: int):
    torch.manual_seed(0)
    layers = []
    for i in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    data = TensorDataset(torch.randn(batch * steps, width), torch.randn(batch * steps, width))
    loader = DataLoader(data, batch_size=batch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    def loop():
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

    return loop


def measure(width: int, batch: int, steps: int, rounds: int, tmp: str) -> dict:
    loop = make(width, batch, steps)
    loop()  # warm up allocator and kernels

    def none():
        t = time.perf_counter()
        loop()
        return time.perf_counter() - t

    def with_stepscope():
        st_torch.instrument()
        run = stepscope.start(dir=tmp, name=f"overhead-{width}-{time.time_ns()}")
        t = time.perf_counter()
        loop()
        elapsed = time.perf_counter() - t
        run.stop()
        st_torch.uninstrument()
        return elapsed

    def with_torch_profiler():
        with profile(activities=[ProfilerActivity.CPU]):
            t = time.perf_counter()
            loop()
            return time.perf_counter() - t

    times = {"none": [], "stepscope": [], "torch.profiler": []}
    for _ in range(rounds):
        for key, fn in (("none", none), ("stepscope", with_stepscope), ("torch.profiler", with_torch_profiler)):
            times[key].append(fn())
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {args.rounds} interleaved rounds")
    print("| model | step (no profiler) | stepscope | torch.profiler |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for width, batch, steps in ((64, 256, 400), (1024, 256, 24)):
            m = measure(width, batch, steps, args.rounds, tmp)
            base = m["none"]
            print(f"| 8-layer MLP, width {width}, batch {batch} | {base / steps * 1e3:.2f} ms "
                  f"| {m['stepscope'] / base:.4f}x | {m['torch.profiler'] / base:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
