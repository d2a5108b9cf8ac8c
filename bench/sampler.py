"""Cost of the system sampler: CPU of its thread at 100 ms and 10 ms, and memory over time.

    python3 bench/sampler.py [--seconds 20] [--minutes-memory 0]

The sampler thread is found by name (stepscope-smpl) and its CPU time read
from /proc/self/task/<tid>/schedstat (nanoseconds on the CPU; the tick-based
utime/stime over-charge a thread that wakes on timer ticks); the figure is
that CPU time over wall time, in percent of one core (host-wide metrics and
this process's own, as the process elected to sample its host does). One
sampling pass's own cost, without the thread's wake-up, is printed beside it. With --minutes-memory N, a session
at 10 ms runs N minutes and the process's RSS is printed every 30 s.
"""

import argparse
import os
import tempfile
import time

import stepscope
from stepscope.core import _native



def sampler_cpu_seconds():
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "stepscope-smpl":
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return int(f.read().split()[0]) / 1e9
        except OSError:
            continue
    raise RuntimeError("no sampler thread")


def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def cpu_share(interval_ms, seconds, tmp):
    run = stepscope.start(dir=tmp, name=f"sampler-{interval_ms}-{time.time_ns()}", interval_ms=interval_ms)
    time.sleep(0.5)
    c0, t0 = sampler_cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    c1, t1 = sampler_cpu_seconds(), time.perf_counter()
    pass_us = _native.sampler_pass_ns(200) / 1e3
    run.stop()
    return 100 * (c1 - c0) / (t1 - t0), pass_us


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--minutes-memory", type=float, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{os.cpu_count()} cpus; CPU of the sampler thread, % of one core, over {args.seconds:.0f} s")
        print("| interval | sampler CPU | one pass |\n| --- | ---: | ---: |")
        for interval in (100, 10):
            share, pass_us = cpu_share(interval, args.seconds, tmp)
            print(f"| {interval} ms | {share:.3f}% | {pass_us:.0f} us |", flush=True)
        if args.minutes_memory:
            run = stepscope.start(dir=tmp, name="sampler-memory", interval_ms=10)
            print("\nRSS of the process while sampling every 10 ms")
            print("| minute | RSS (MiB) |\n| ---: | ---: |")
            end = time.time() + 60 * args.minutes_memory
            start = time.time()
            while time.time() < end:
                print(f"| {(time.time() - start) / 60:.1f} | {rss_mb():.1f} |", flush=True)
                time.sleep(30)
            print(f"| {(time.time() - start) / 60:.1f} | {rss_mb():.1f} |", flush=True)
            run.stop()


if __name__ == "__main__":
    main()
