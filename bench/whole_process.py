"""The always-on cost as a user measures it: the same training script run as whole
processes, plain and under ``STEPSCOPE=1``, interleaved pair by pair.

    python3 bench/whole_process.py [--pairs 30] [--sizes 0.3,0.7,5] [--breakdown] [--idle 10] [--quick]

Each pair runs the script once plain and once profiled (and, with ``--breakdown``, once
more per configuration with one part of stepscope turned off), in a shuffled order, so
that the machine's drift (±20% over seconds on a shared VM) falls on both sides of a
pair. The script (``--job``) is an 8-layer MLP at one torch thread reading a DataLoader
over in-memory tensors, SGD, its batch calibrated on this machine to the step size
named (the nearest of a few, probed in the bench's own process): what ``STEPSCOPE=1``
does to it is what it does to a user's script. It prints its loop's wall time; per pair
the bench takes the profiled loop's time less the plain one's, per step, and prints
the distribution of those differences (median, p10, p90 in microseconds a step) and of
the ratios, not only a ratio of medians; the whole process's wall time (import, start and stop included); and the
difference in the process's CPU time over the loop, per step (every thread's: the
samplers' and the writer's too), which a VM's steal time does not inflate.

The parts (``--breakdown``), each turned off in turn by its variable (docs/design.md):
op windows (``STEPSCOPE_OPS=0``), the Python sampler (``STEPSCOPE_PYSAMPLE_HZ=0``), the
system sampler (``STEPSCOPE_INTERVAL_MS=60000``: one sample a minute), the writer's
flushes (``STEPSCOPE_FLUSH_MS=60000``), and all four at once: what is left is the hooks.
GPU paths are absent on a machine without a GPU (``STEPSCOPE_GPU=off`` everywhere).

``--idle S``: the samplers' cost with nothing to measure: a process that imports torch,
turns stepscope on and sleeps S seconds; its CPU time over the sleep alone (all threads,
start and stop left out) less the plain one's, as a share of one core, and beside it the
whole process's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
# step size (ms, as named) -> the MLP's width; the batch is calibrated on this machine to give
# that step (``calibrate``), and the steps to give LOOP_S of loop
SIZES = {"0.3": 16, "0.7": 64, "5": 384}
LOOP_S = 1.5
BATCHES = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
PARTS = {
    "no op windows": {"STEPSCOPE_OPS": "0"},
    "no Python sampler": {"STEPSCOPE_PYSAMPLE_HZ": "0"},
    "no system sampler": {"STEPSCOPE_INTERVAL_MS": "60000"},
    "no flushes": {"STEPSCOPE_FLUSH_MS": "60000"},
    "hooks only": {"STEPSCOPE_OPS": "0", "STEPSCOPE_PYSAMPLE_HZ": "0", "STEPSCOPE_INTERVAL_MS": "60000",
                   "STEPSCOPE_FLUSH_MS": "60000"},
}


def training(width: int, batch: int):
    """The training script's loop: ``run(steps)`` trains that many steps and returns
    (wall s, process CPU s) of them (bench/in_process.py runs it in chunks)."""
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(batch * 50, width), torch.randn(batch * 50, width))
    loader = DataLoader(data, batch_size=batch, shuffle=True)

    def run(steps: int) -> tuple:
        done, t0, c0 = 0, time.perf_counter(), time.process_time()
        while done < steps:
            for x, y in loader:
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                done += 1
                if done == steps:
                    break
        return time.perf_counter() - t0, time.process_time() - c0

    return run


def job(width: int, batch: int, steps: int, quiet: bool = False) -> float:
    """The training script: prints {"loop_s", "loop_cpu_s", "steps"} as its last line;
    returns the loop's time."""
    loop_s, loop_cpu_s = training(width, batch)(steps)
    if not quiet:
        print(json.dumps({"loop_s": loop_s, "loop_cpu_s": loop_cpu_s, "steps": steps}))
    return loop_s


def calibrate(target_ms: float, width: int) -> tuple:
    """(batch, steps): the batch whose plain step on this machine is nearest ``target_ms``
    (probed in this process, 60 steps each after 20 of warm-up), and the steps for LOOP_S."""
    best = None
    for batch in BATCHES:
        job(width, batch, 20, quiet=True)
        step_ms = job(width, batch, 60, quiet=True) / 60 * 1e3
        if best is None or abs(step_ms - target_ms) < abs(best[1] - target_ms):
            best = (batch, step_ms)
        if step_ms >= target_ms:
            break
    batch, step_ms = best
    return batch, max(50, int(LOOP_S * 1e3 / max(step_ms, 1e-3)))


def idle(seconds: float) -> None:
    """Imports torch, a model, then sleeps: the samplers run with nothing to measure. Prints
    the process's CPU time (all threads) over the sleep alone: start and stop left out."""
    import torch.nn as nn

    nn.Linear(8, 8)
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(json.dumps({"slept_s": seconds, "sleep_cpu_s": used}))


def run_one(args: list, env_extra: dict, tmp: str) -> dict:
    """One process: its printed figures, wall time and CPU time (its children's rusage)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_GPU="off", STEPSCOPE_DIR=os.path.join(tmp, "runs"), **env_extra)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, HERE, *args], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"the job failed ({out.returncode}): {out.stderr[-2000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures.update(wall_s=wall, cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    return figures


def pct(values: list, q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def measure_size(size: str, pairs: int, configs: dict, tmp: str, steps_scale: float) -> None:
    width = SIZES[size]
    batch, steps = calibrate(float(size), width)
    steps = max(50, int(steps * steps_scale))
    args = ["--job", str(width), str(batch), str(steps)]
    results = {name: [] for name in configs}
    for i in range(pairs):
        order = list(configs)
        random.shuffle(order)
        pair = {name: run_one(args, configs[name], tmp) for name in order}
        for name in configs:
            results[name].append(pair[name])
        print(f"  {size} ms, pair {i + 1}/{pairs}", file=sys.stderr, flush=True)
    plain = results["plain"]
    step_ms = statistics.median(r["loop_s"] / r["steps"] for r in plain) * 1e3
    print(f"\n### about {size} ms a step (measured plain: {step_ms:.3f} ms; width {width}, batch {batch} as "
          f"calibrated, {steps} steps; {pairs} pairs)\n")
    print("| configuration | median ratio | p10 | p90 | µs a step (median) | p10 | p90 | whole process, ms "
          "| CPU µs a step (median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in configs:
        if name == "plain":
            continue
        ratio = [r["loop_s"] / p["loop_s"] for r, p in zip(results[name], plain)]
        diff = [(r["loop_s"] - p["loop_s"]) / r["steps"] * 1e6 for r, p in zip(results[name], plain)]
        whole = [(r["wall_s"] - p["wall_s"]) * 1e3 for r, p in zip(results[name], plain)]
        # (the process's CPU time in the loop, all its threads: what the VM's steal does not inflate)
        cpu = [(r["loop_cpu_s"] - p["loop_cpu_s"]) / r["steps"] * 1e6 for r, p in zip(results[name], plain)]
        print(f"| {name} | {statistics.median(ratio):.4f}x | {pct(ratio, 0.1):.4f} | {pct(ratio, 0.9):.4f} | "
              f"{statistics.median(diff):+.1f} | {pct(diff, 0.1):+.1f} | {pct(diff, 0.9):+.1f} | "
              f"{statistics.median(whole):+.0f} | {statistics.median(cpu):+.1f} |")


def measure_idle(seconds: float, pairs: int, tmp: str) -> None:
    cost, whole = [], []
    for _ in range(pairs):
        plain = run_one(["--idle-job", str(seconds)], {}, tmp)
        profiled = run_one(["--idle-job", str(seconds)], {"STEPSCOPE": "1"}, tmp)
        cost.append((profiled["sleep_cpu_s"] - plain["sleep_cpu_s"]) / seconds * 100)
        whole.append((profiled["cpu_s"] - plain["cpu_s"]) / seconds * 100)
    print(f"\n### idle: {seconds:g} s asleep after importing torch, every sampler on ({pairs} pairs)\n")
    print(f"CPU of one core while idle (the sleep alone): median {statistics.median(cost):.3f}%, "
          f"p10 {pct(cost, 0.1):.3f}%, p90 {pct(cost, 0.9):.3f}%; the whole process, start and stop included: "
          f"median {statistics.median(whole):.2f}%")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--sizes", default="0.3,0.7,5", help="step sizes, of " + ", ".join(SIZES))
    p.add_argument("--breakdown", action="store_true", help="each part turned off in turn as well")
    p.add_argument("--idle", type=float, default=0.0, metavar="S", help="also the idle cost over S seconds")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 pairs, short loops (CI)")
    p.add_argument("--job", nargs=3, type=int, help=argparse.SUPPRESS)
    p.add_argument("--idle-job", dest="idle_job", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return job(*args.job)
    if args.idle_job is not None:
        return idle(args.idle_job)
    pairs, scale = (2, 0.05) if args.quick else (args.pairs, 1.0)
    configs = {"plain": {}, "STEPSCOPE=1": {"STEPSCOPE": "1"}}
    if args.breakdown:
        configs.update({name: {"STEPSCOPE": "1", **env} for name, env in PARTS.items()})
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        for size in filter(None, args.sizes.split(",")):  # (--sizes "": the idle cost alone)
            if size not in SIZES:
                p.error(f"--sizes: {size} is not one of {', '.join(SIZES)}")
            measure_size(size, pairs, configs, tmp, scale)
        if args.idle:
            measure_idle(args.idle, 2 if args.quick else min(pairs, 10), tmp)
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
