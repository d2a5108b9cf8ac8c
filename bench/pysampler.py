"""The Python stack sampler's cost on a real PyTorch training loop, and its bytes per sample.

    python3 bench/pysampler.py [--rounds 10] [--seconds 2] [--hz 100]
    python3 bench/pysampler.py --pairs 300    # only the cost per step, in paired chunks
    python3 bench/pysampler.py --idle 25      # only an idle job's CPU, without and with the sampler

An 8-layer MLP (width 64, batch 128: ~1 ms steps on the development VM), one
torch thread, a DataLoader over in-memory tensors, SGD, under
``integrations.torch.instrument()`` and a running session, as ``STEPSCOPE=1``
runs it. Two configurations run in one process, interleaved round by round:
the session with ``pysample_hz=0`` (no sampler) and with ``pysample_hz=HZ``.
Each round times a fixed number of steps (about ``--seconds`` of training) in
both; the figure is the median over rounds of the ratio (pairing cancels the
VM's drifts in speed).

Reported: the loop's slowdown with the sampler (wall time, and the loop
thread's own CPU time, which other processes on a shared machine disturb less); the sampler thread's CPU time
(its thread CPU clock, the scheduler's nanosecond count) as a share of one
core over the session; the time it held the GIL and waited for it per pass;
and the bytes its chunks (PYSTACKS with the strings, frames and stacks, and
PYSAMPLES) took in the trace file per sample, over one longer session. Then
the cost of threads that only wait: N threads blocked D calls deep while the
main thread sleeps, 3 s each (every pass walks every thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

import stepscope
from overhead import make  # the same training loop as the overhead bench
from stepscope.core import _native
from stepscope.integrations import torch as st_torch


def session(loop, steps: int, hz: int, tmp: str) -> dict:
    st_torch.instrument()
    run = stepscope.start(dir=tmp, name=f"pys-{hz}-{time.time_ns()}", pysample_hz=hz)
    try:
        loop(5)  # root discovery: once per job
        t0, c0 = time.perf_counter(), time.thread_time()
        loop(steps)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        st = _native.pysampler_status()
        session_s = time.time() - run._start_wall
    finally:
        run.stop()
        st_torch.uninstrument()
    trace = os.path.join(run.process_dir, "trace.ssc")
    return {"wall": wall, "cpu": cpu, "status": st, "session_s": session_s, "after": _native.pysampler_status(),
            "trace_bytes": os.path.getsize(trace) if os.path.exists(trace) else 0}


def pairs(n: int, hz: int, tmp: str, chunk: int = 50) -> dict:
    """The sampler's cost per step of the small loop (width 16, batch 16), resolved the
    way this VM allows: n pairs of short chunks in one instrumented session, the sampler
    started for one chunk and stopped for the other; the median of the differences."""
    loop = make(16, 16)
    loop(20)
    st_torch.instrument()
    run = stepscope.start(dir=tmp, name=f"pys-pairs-{time.time_ns()}", pysample_hz=0)
    diffs, base, passes, by_main, hold, read = [], [], 0, 0, 0, 0
    try:
        for i in range(n):
            times = {}
            for on in ((False, True) if i % 2 else (True, False)):
                if on:
                    _native.pysampler_start(hz)
                loop(3)
                t = time.perf_counter()
                loop(chunk)
                times[on] = time.perf_counter() - t
                if on:
                    st = _native.pysampler_status()
                    passes, by_main, hold = passes + st["passes"], by_main + st["main_passes"], hold + st["hold_ns"]
                    read += st["read_ns"]
                    _native.pysampler_stop()
            diffs.append((times[True] - times[False]) / chunk)
            base.append(times[False] / chunk)
    finally:
        run.stop()
        st_torch.uninstrument()
    return {"step_s": statistics.median(base), "us": statistics.median(diffs) * 1e6,
            "se_us": 1.2533 * statistics.stdev(diffs) / len(diffs) ** 0.5 * 1e6, "passes": passes,
            "main_passes": by_main, "hold_us": hold / max(passes, 1) / 1e3, "read_us": read / max(passes, 1) / 1e3}


def idle_threads(n: int, depth: int, tmp: str, hz: int, seconds: float = 3.0) -> dict:
    import threading

    ev = threading.Event()

    def deep(k):
        ev.wait() if k == 0 else deep(k - 1)

    threads = [threading.Thread(target=deep, args=(depth,), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    run = stepscope.start(dir=tmp, name=f"idle-{n}-{depth}-{time.time_ns()}", pysample_hz=hz)
    time.sleep(seconds)
    st = _native.pysampler_status()
    wall = time.time() - run._start_wall
    ev.set()
    run.stop()
    for t in threads:
        t.join()
    return {"hold_us": st["hold_ns"] / max(st["passes"], 1) / 1e3, "cpu": st["cpu_ns"] / 1e9 / wall,
            "samples": st["samples"]}


def idle_job(seconds: float, hz: int, tmp: str) -> dict:
    """An idle job (the main thread asleep, no training) under a session: the process's CPU
    (every stepscope thread: the system sampler, the writer, the Python sampler) as a share of
    one core, and the Python sampler thread's own."""
    run = stepscope.start(dir=tmp, name=f"idle-{hz}-{time.time_ns()}", pysample_hz=hz)
    time.sleep(1.0)  # past the start's own work
    c0, t0 = time.process_time(), time.perf_counter()
    s0 = _native.pysampler_status()
    time.sleep(seconds)
    c1, t1 = time.process_time(), time.perf_counter()
    s1 = _native.pysampler_status()
    run.stop()
    sampler = (s1["cpu_ns"] - s0["cpu_ns"]) / 1e9 / (t1 - t0) if hz else 0.0
    return {"process": (c1 - c0) / (t1 - t0), "sampler": sampler, "method": s1["method"],
            "gil_passes": s1["gil_passes"], "passes": s1["passes"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=2.0, help="training time per configuration and round")
    parser.add_argument("--hz", type=int, default=100)
    parser.add_argument("--long", type=float, default=20.0, help="seconds of the session that counts bytes")
    parser.add_argument("--pairs", type=int, default=0, metavar="N",
                        help="only the cost per step of the small loop: N paired 50-step chunks, sampler on/off")
    parser.add_argument("--idle", type=float, default=0, metavar="S",
                        help="only an idle job's cost: S seconds asleep in a session, without the Python "
                             "sampler and with it (each method), process CPU and the sampler's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.idle:
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; idle {args.idle:.0f} s, {args.hz} Hz")
        print("| Python sampler | process CPU (all of stepscope) | Python sampler thread | passes (with the GIL) |")
        print("| --- | ---: | ---: | ---: |")
        with tempfile.TemporaryDirectory() as tmp:
            for label, hz, method in (("off", 0, "frames"), ("frame reader", args.hz, "frames"),
                                      ("GIL walk", args.hz, "gil")):
                os.environ["STEPSCOPE_PYSAMPLE_METHOD"] = method
                r = idle_job(args.idle, hz, tmp)
                print(f"| {label} | {100 * r['process']:.3f}% | {100 * r['sampler']:.3f}% | "
                      f"{r['passes']} ({r['gil_passes']}) |", flush=True)
        return
    if args.pairs:
        with tempfile.TemporaryDirectory() as tmp:
            r = pairs(args.pairs, args.hz, tmp)
        print(f"sampler at {args.hz} Hz, {r['step_s'] * 1e3:.3f} ms a step: {r['us']:.1f} +- {r['se_us']:.1f} us a "
              f"step; {r['main_passes']} of {r['passes']} passes walked by the main thread, "
              f"{r['hold_us']:.1f} us each with the GIL, {r['read_us']:.1f} us reading frames without it; "
              f"method {_native.pysampler_status()['method']}")
        return
    loop = make(64, 128)
    loop(20)
    t = time.perf_counter()
    loop(100)
    step_s = (time.perf_counter() - t) / 100
    steps = max(50, int(args.seconds / step_s))
    ratios, cpu_ratios, cpu, hold, wait = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            off = session(loop, steps, 0, tmp)
            on = session(loop, steps, args.hz, tmp)
            ratios.append(on["wall"] / off["wall"])
            cpu_ratios.append(on["cpu"] / off["cpu"])
            st = on["status"]
            cpu.append(st["cpu_ns"] / 1e9 / on["session_s"])
            hold.append(st["hold_ns"] / max(st["passes"], 1))
            wait.append(st["gil_wait_ns"] / max(st["passes"], 1))
        long = session(loop, max(steps, int(args.long / step_s)), args.hz, tmp)
    after = long["after"]
    print(f"torch {torch.__version__}, 1 thread, 8-layer MLP width 64 batch 128, {step_s * 1e3:.2f} ms a step, "
          f"{steps} steps a round, median of {args.rounds} interleaved rounds, {args.hz} Hz")
    print("| figure | value |")
    print("| --- | ---: |")
    print(f"| loop time with the sampler / without | {statistics.median(ratios):.4f}x "
          f"(rounds: {min(ratios):.4f}-{max(ratios):.4f}) |")
    print(f"| loop thread's CPU time with the sampler / without | {statistics.median(cpu_ratios):.4f}x "
          f"(rounds: {min(cpu_ratios):.4f}-{max(cpu_ratios):.4f}) |")
    print(f"| sampler thread CPU, share of one core | {100 * statistics.median(cpu):.3f}% "
          f"(rounds: {100 * min(cpu):.3f}-{100 * max(cpu):.3f}%) |")
    print(f"| GIL held per pass | {statistics.median(hold) / 1e3:.1f} us |")
    print(f"| GIL wait per pass | {statistics.median(wait) / 1e3:.1f} us |")
    print(f"| samples in a {args.long:.0f} s session | {after['samples']} ({after['dropped']} dropped), "
          f"{after['stacks']} stacks, {after['frames']} frames |")
    print(f"| bytes per sample on disk (tables included) | {after['bytes'] / max(after['samples'], 1):.2f} B |")
    print(f"| trace file of that session | {long['trace_bytes'] / 1e3:.0f} kB, of which samples "
          f"{after['bytes'] / 1e3:.0f} kB |")
    print()
    print("| waiting threads x depth | GIL held per pass | sampler CPU (one core) |")
    print("| --- | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for n, depth in ((1, 10), (30, 10), (30, 100)):
            r = idle_threads(n, depth, tmp, args.hz)
            print(f"| {n} x {depth} | {r['hold_us']:.1f} us | {100 * r['cpu']:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
