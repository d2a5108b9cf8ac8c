"""Whole-loop overhead on real PyTorch training: stepscope vs no profiler vs torch.profiler.

    python3 bench/overhead.py [--rounds 15] [--quick]

An 8-layer MLP (width 16, batch 16: ~0.4 ms steps; width 64: ~1 ms; width
1024: ~50 ms on the development VM), one torch thread, a DataLoader over
in-memory tensors, SGD; and the small MLP ``torch.compile``d (inductor when a
C compiler is present, else ``aot_eager``).
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

``--ddp`` adds a 2-rank DistributedDataParallel row over gloo (two processes from
torch.multiprocessing.spawn, each one torch thread; the same three configurations,
interleaved round by round in both ranks together, rank 0's times): with stepscope,
every bucket's all-reduce goes through stepscope's comm hook and is recorded with its
completion, and the end-of-backward wait (integrations/torch/_collectives.py).

``--hooks N`` adds the per-step cost measured the way this shared VM allows:
N pairs of short chunks (25 steps, ~15 ms) in one running session, the
integration turned off for one chunk and on for the other; the median of the
pairs' differences, with its standard error. Short pairs see the same VM
speed, which whole rounds of hundreds of milliseconds do not (their spread is
tens of microseconds a step here, more than the cost sought). Twice: with the
session's samplers (system metrics, Python stacks) running in both chunks
(the hooks alone), and running in the "on" side only (hooks and samplers:
all that a loop pays under ``STEPSCOPE=1``, but the once-per-job start and
stop; each side then a block of chunks spanning two sampling intervals, timed
after the samplers' first sample). ``--cpu`` times those chunks in the training thread's CPU time instead
of wall time.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, TensorDataset

import stepscope
from stepscope.integrations import torch as st_torch


def compile_backend() -> str:
    import shutil

    return "inductor" if shutil.which("cc") or shutil.which("gcc") else "aot_eager"


def make(width: int, batch: int, compiled: bool = False):
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    if compiled:
        model = torch.compile(model, backend=compile_backend())
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


def measure(width: int, batch: int, steps: int, rounds: int, tmp: str, compiled: bool = False) -> dict:
    """Median over rounds of each configuration's time relative to the no-profiler
    chunk of the same round: pairing cancels the VM's slow drifts in speed."""
    loop = make(width, batch, compiled)
    loop(10)  # warm up allocator and kernels

    def timed(warmup=5):
        loop(warmup)  # stepscope's root discovery, the profiler's first steps: once per job
        t = time.perf_counter()
        loop(steps)
        return time.perf_counter() - t

    return interleaved(timed, tmp, f"overhead-{width}", steps, rounds)


def interleaved(timed, tmp: str, name: str, steps: int, rounds: int) -> dict:
    """Rounds of the three configurations, each ``timed()`` (seconds for ``steps`` steps):
    no profiler, stepscope (instrumented and a running session), torch.profiler."""
    def with_stepscope():
        st_torch.instrument()
        run = stepscope.start(dir=tmp, name=f"{name}-{time.time_ns()}")
        try:
            return timed()
        finally:
            run.stop()
            st_torch.uninstrument()

    def with_torch_profiler():
        with profile(activities=[ProfilerActivity.CPU]):
            return timed()

    base, ratios, extra = [], {"stepscope": [], "torch.profiler": []}, []
    for _ in range(rounds):
        t_none = timed()
        base.append(t_none)
        t_ss = with_stepscope()
        ratios["stepscope"].append(t_ss / t_none)
        extra.append((t_ss - t_none) / steps)
        ratios["torch.profiler"].append(with_torch_profiler() / t_none)
    return {"step_s": statistics.median(base) / steps, "us_per_step": statistics.median(extra) * 1e6,
            **{k: statistics.median(v) for k, v in ratios.items()}}


def _ddp_worker(rank: int, port: int, width: int, batch: int, steps: int, rounds: int, tmp: str, out: str):
    import json

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["STEPSCOPE_OPS"] = "0"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = DDP(nn.Sequential(*layers[:-1]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def loop(n):
        for _ in range(n):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    def timed():
        loop(5)
        dist.barrier()
        t = time.perf_counter()
        loop(steps)
        return time.perf_counter() - t

    loop(10)
    result = interleaved(timed, tmp, f"ddp-{rank}", steps, rounds)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def measure_ddp(width: int, batch: int, steps: int, rounds: int, tmp: str) -> dict:
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tmp, "ddp.json")
    mp.spawn(_ddp_worker, args=(port, width, batch, steps, rounds, tmp, out), nprocs=2)
    with open(out) as f:
        return json.load(f)


def hook_cost(width: int, batch: int, pairs: int, tmp: str, chunk: int = 25, clock=time.perf_counter,
              samplers: bool = False) -> dict:
    """Median of paired (on - off) differences per step over short chunks, in one session.
    samplers: the session's samplers (system metrics, Python stacks) run in the "on" side
    only, so the difference is all a loop pays under STEPSCOPE=1 but the once-per-job start
    and stop; else they run in both, and the difference is the hooks alone.

    With samplers, each side of a pair is a block of chunks spanning at least two sampling
    intervals, timed from a short settling run after the samplers start: the system sampler
    samples (and scans /proc) the moment it starts, so timing right after a start would
    charge a sample per chunk, several times the rate a running job pays."""
    from stepscope.core import _native
    from stepscope.core.config import resolve

    loop = make(width, batch)
    loop(20)
    config = resolve()

    def timed():
        t = clock()
        loop(chunk)
        return clock() - t

    def set_samplers(on: bool) -> None:
        if on:
            _native.start_sampler(config.interval_ms, True, True)
            if config.pysample_hz:
                _native.pysampler_start(config.pysample_hz)
        else:
            _native.stop_sampler()
            _native.pysampler_stop()

    block, settle_s = 1, 0.0
    if samplers:
        t = time.perf_counter()
        loop(chunk)
        chunk_s = time.perf_counter() - t
        block = max(1, math.ceil(2 * config.interval_ms / 1e3 / chunk_s))
        settle_s = 0.03
        pairs = max(10, pairs // block)  # about the same time as without samplers

    def settle(since: float) -> None:
        loop(5)  # past root discovery (its global hooks run for the first steps of a job)
        while time.perf_counter() - since < settle_s:
            loop(1)

    run = stepscope.start(dir=tmp, name=f"hooks-{width}-{time.time_ns()}")
    diffs, base = [], []
    try:
        for i in range(pairs):
            # alternate which side comes first: the second of a pair runs ~5 us a step
            # slower here whatever it is (measured with the integration off in both)
            order = (False, True) if i % 2 else (True, False)
            times = {}
            for on in order:
                toggled = time.perf_counter()
                if on != st_torch.instrumentor.is_instrumented():
                    st_torch.instrument() if on else st_torch.uninstrument()
                    if samplers:
                        set_samplers(on)
                settle(toggled)
                times[on] = sum(timed() for _ in range(block))
            on, off = times[True], times[False]
            diffs.append((on - off) / (chunk * block))
            base.append(off / (chunk * block))
    finally:
        run.stop()
        st_torch.uninstrument()
    return {"step_s": statistics.median(base), "us": statistics.median(diffs) * 1e6,
            "se_us": median_se(diffs) * 1e6}


def median_se(values: list) -> float:
    """The standard error of a median, from the median absolute deviation: the paired
    differences here have heavy tails (a preempted chunk is off by milliseconds), which
    the standard deviation weighs in full and the median does not."""
    mid = statistics.median(values)
    sigma = 1.4826 * statistics.median(abs(v - mid) for v in values)  # sigma, were the body normal
    return 1.2533 * sigma / len(values) ** 0.5


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="the small configurations only")
    parser.add_argument("--op-windows", action="store_true",
                        help="keep the operator windows on (each round is a new session, so every round would pay "
                             "the early window at steps 5-7: their cost is bench/op_windows.py's)")
    parser.add_argument("--hooks", type=int, default=0, metavar="N",
                        help="also the cost per step of the hooks, and of hooks and samplers: N paired short "
                             "chunks each (300: ~3 minutes)")
    parser.add_argument("--cpu", action="store_true",
                        help="--hooks in the training thread's CPU time (time.thread_time): preemption left out")
    parser.add_argument("--ddp", action="store_true",
                        help="also a 2-rank gloo DDP row (8-layer MLP, width 256, batch 64; two processes)")
    parser.add_argument("--gpu", choices=["auto", "off", "metrics", "trace"],
                        help="the sessions' STEPSCOPE_GPU (default: the environment's, else auto; on a GPU host auto "
                             "traces with CUPTI and samples NVML while the CPU loop is timed)")
    args = parser.parse_args()
    if args.gpu:
        os.environ["STEPSCOPE_GPU"] = args.gpu
    if not args.op_windows:
        os.environ["STEPSCOPE_OPS"] = "0"  # the hot path alone; the Python stack sampler stays on
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {args.rounds} interleaved rounds; "
          f"compiled with {compile_backend()}")
    print("| model | step (no profiler) | stepscope | stepscope per step | torch.profiler |")
    print("| --- | ---: | ---: | ---: | ---: |")
    configs = [(16, 16, 200, False), (16, 16, 200, True), (64, 128, 60, False)]
    if not args.quick:
        configs.append((1024, 128, 12, False))
    with tempfile.TemporaryDirectory() as tmp:
        for width, batch, steps, compiled in configs:
            m = measure(width, batch, steps, args.rounds, tmp, compiled)
            name = f"8-layer MLP, width {width}, batch {batch}" + (", torch.compile" if compiled else "")
            print(f"| {name} | {m['step_s'] * 1e3:.2f} ms | {m['stepscope']:.4f}x | {m['us_per_step']:.1f} us "
                  f"| {m['torch.profiler']:.3f}x |", flush=True)
        if args.ddp:
            m = measure_ddp(256, 64, 40, args.rounds, tmp)
            print(f"| DDP over gloo, 2 ranks: 8-layer MLP, width 256, batch 64 | {m['step_s'] * 1e3:.2f} ms "
                  f"| {m['stepscope']:.4f}x | {m['us_per_step']:.1f} us | {m['torch.profiler']:.3f}x |", flush=True)
        if args.hooks:
            print()
            print("| model | step (no profiler) | per step (median of paired chunks) | ratio |")
            print("| --- | ---: | ---: | ---: |")
            clock = time.thread_time if args.cpu else time.perf_counter
            for width, batch in [(16, 16), (64, 128)]:
                for samplers in (False, True):
                    h = hook_cost(width, batch, args.hooks, tmp, clock=clock, samplers=samplers)
                    what = "hooks and samplers" if samplers else "hooks"
                    print(f"| 8-layer MLP, width {width}, batch {batch} | {h['step_s'] * 1e3:.2f} ms "
                          f"| {what}: {h['us']:.1f} us +- {h['se_us']:.1f} | {1 + h['us'] / 1e6 / h['step_s']:.4f}x |",
                          flush=True)


if __name__ == "__main__":
    main()
