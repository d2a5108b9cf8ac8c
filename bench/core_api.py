"""Core overhead benchmarks: ns per annotation, bytes per event, throughput, memory.

    python3 bench/core_api.py            (torch optional: its rows are skipped without it)

Everything runs in this one process so the figures compare like with like.
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import stepscope
from stepscope.core import _native

PAIRS = 1_000_000
REPEATS = 5
rows = []


def row(what, value, unit, note=""):
    rows.append((what, value, unit, note))
    print(f"  {what:<62} {value:>12} {unit:<10} {note}", flush=True)


def best_ns_per_iter(fn, n=PAIRS, repeats=REPEATS):
    """Median of `repeats` timings of fn(n), minus the empty loop, in ns per iteration."""
    def empty(n):
        for _ in range(n):
            pass

    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter_ns()
        empty(n)
        t1 = time.perf_counter_ns()
        fn(n)
        t2 = time.perf_counter_ns()
        times.append(((t2 - t1) - (t1 - t0)) / n)
    return statistics.median(times)


def bench_annotations(tmp):
    print("ns per enter+exit pair (lower is better)")
    run = stepscope.start(dir=tmp, name="bench-annotate", buffer_mb=512)
    ann = stepscope.annotate
    begin, end = stepscope.annotation_begin, stepscope.annotation_end

    def with_annotate(n):
        for _ in range(n):
            with ann("x"):
                pass

    def with_begin_end(n):
        for _ in range(n):
            end(begin("x"))

    @contextlib.contextmanager
    def plain_cm():
        yield

    class PlainClass:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def with_plain_generator(n):
        for _ in range(n):
            with plain_cm():
                pass

    def with_plain_class(n):
        for _ in range(n):
            with PlainClass():
                pass

    results = {}
    results["annotate"] = best_ns_per_iter(with_annotate)
    row("stepscope.annotate (with, recording)", f"{results['annotate']:.0f}", "ns/pair")
    results["begin_end"] = best_ns_per_iter(with_begin_end)
    row("stepscope.annotation_begin/end (recording)", f"{results['begin_end']:.0f}", "ns/pair")
    cpp = min(_native.bench_cpp_pair(10_000_000, _native.intern("cpp")) for _ in range(3))
    row("C++ API: ticks() + record_span() (recording)", f"{cpp:.1f}", "ns/pair", "two clock reads are the floor")
    stats = _native.stats()
    run.stop()
    row("  (events dropped during these loops)", f"{stats['dropped']}", "events")
    results["off"] = best_ns_per_iter(with_annotate)
    row("stepscope.annotate, no session (no-op)", f"{results['off']:.0f}", "ns/pair")
    row("plain Python class with __enter__/__exit__", f"{best_ns_per_iter(with_plain_class):.0f}", "ns/pair")
    row("contextlib.contextmanager generator", f"{best_ns_per_iter(with_plain_generator, n=PAIRS // 4):.0f}", "ns/pair")

    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        row("torch rows", "skipped", "", "torch is not installed")
        return results

    def with_record_function(n):
        for _ in range(n):
            with record_function("x"):
                pass

    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)

    def with_rf_fast(n):
        for _ in range(n):
            with fast("x"):
                pass

    n_torch = PAIRS // 10
    results["rf_off"] = best_ns_per_iter(with_record_function, n=n_torch)
    row(f"torch.profiler.record_function, profiler off (torch {torch.__version__})",
        f"{results['rf_off']:.0f}", "ns/pair")
    if fast:
        row("torch._C._profiler._RecordFunctionFast, profiler off", f"{best_ns_per_iter(with_rf_fast, n=n_torch):.0f}",
            "ns/pair")
    with profile(activities=[ProfilerActivity.CPU]):
        results["rf_on"] = best_ns_per_iter(with_record_function, n=n_torch // 4, repeats=3)
        rf_fast_on = best_ns_per_iter(with_rf_fast, n=n_torch // 4, repeats=3) if fast else None
    row("torch.profiler.record_function, inside torch.profiler.profile", f"{results['rf_on']:.0f}", "ns/pair")
    if fast:
        row("torch._C._profiler._RecordFunctionFast, inside torch.profiler.profile", f"{rf_fast_on:.0f}", "ns/pair")
    row("ratio: record_function (profiling) / stepscope.annotate (recording)",
        f"{results['rf_on'] / results['annotate']:.1f}", "x")
    return results


def bench_training_loop(tmp):
    """A small real torch CPU training step, annotated by phase: wall time ratios."""
    try:
        import torch
    except ImportError:
        return
    print("small MLP training loop on CPU, 5 phases annotated per step (ratios vs no profiler)")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)

    def loop(steps, mark):
        for _ in range(steps):
            mark_step, phase = mark
            mark_step()
            with phase("GetNext"):
                xb, yb = x, y
            with phase("Forward"):
                out = model(xb)
            with phase("Loss"):
                loss = torch.nn.functional.mse_loss(out, yb)
            with phase("Backward"):
                loss.backward()
            with phase("Optimizer"):
                opt.step()
                opt.zero_grad()

    null = contextlib.nullcontext()
    plain = (lambda: None, lambda name: null)
    ours = (stepscope.step, stepscope.phase)
    from torch.profiler import ProfilerActivity, profile, record_function

    theirs = (lambda: None, record_function)
    steps = 3000
    loop(200, plain)

    # Only the loop is timed: session start/stop and torch.profiler's
    # post-processing happen once per job, not per step.
    def with_stepscope():
        run = stepscope.start(dir=tmp, name=f"bench-loop-{time.time_ns()}")
        t = time.perf_counter()
        loop(steps, ours)
        elapsed = time.perf_counter() - t
        run.stop()
        return elapsed

    def with_torch_profiler():
        with profile(activities=[ProfilerActivity.CPU]):
            t = time.perf_counter()
            loop(steps, theirs)
            return time.perf_counter() - t

    def without():
        t = time.perf_counter()
        loop(steps, plain)
        return time.perf_counter() - t

    # Interleaved rounds, median of each: drift of the machine hits all three alike.
    times = {"base": [], "ss": [], "tp": []}
    for _ in range(7):
        for key, fn in (("base", without), ("ss", with_stepscope), ("tp", with_torch_profiler)):
            times[key].append(fn())
    base, ss, tp = (statistics.median(times[k]) for k in ("base", "ss", "tp"))
    row("no profiler", f"{base / steps * 1e6:.1f}", "us/step")
    row("stepscope (phases + step marks)", f"{ss / steps * 1e6:.1f}", "us/step", f"{ss / base:.3f}x of no profiler")
    row("torch.profiler (CPU activities, record_function per phase)", f"{tp / steps * 1e6:.1f}", "us/step",
        f"{tp / base:.3f}x of no profiler")


def bench_format_and_reader(tmp):
    print("format: bytes per event, write and read throughput")
    run = stepscope.start(dir=tmp, name="bench-format", buffer_mb=1024)
    tpn = _native.clock_info()["ticks_per_ns"]
    phase_cat = stepscope.CATEGORIES.index("phase")
    ids = [_native.intern(p) for p in ("GetNext", "Forward", "Loss", "Backward", "Optimizer")]
    rng = np.random.default_rng(0)
    steps = 400_000
    durs = (rng.integers(200_000, 20_000_000, size=(steps, 5)) * tpn).astype(np.int64).tolist()
    gap = int(5_000 * tpn)
    span, step, now = _native.span, stepscope.step, _native.now
    t = now()
    t_write = time.perf_counter()
    for s in range(steps):
        step()
        for pid, d in zip(ids, durs[s]):
            span(phase_cat, pid, t, t + d)
            t += d + gap
    run.stop()
    t_write = time.perf_counter() - t_write
    stats = run.stats
    n = stats["written"]
    trace = [os.path.join(run.path, d, "trace.ssc") for d in os.listdir(run.path)
             if os.path.isdir(os.path.join(run.path, d))][0]
    size = os.path.getsize(trace)
    row("bytes per event (ms-scale phases + step marks, 6 events/step)", f"{size / n:.2f}", "B/event",
        f"{n} events, dropped {stats['dropped']}")
    row("record + write from Python (span() per event)", f"{n / t_write / 1e6:.1f}", "M events/s")
    decode = []
    for _ in range(3):
        t0 = time.perf_counter()
        cols = _native.read_trace(trace)
        decode.append(time.perf_counter() - t0)
        assert len(cols["start"]) == n
        del cols
    row("read: decode trace into numpy columns", f"{n / min(decode) / 1e6:.1f}", "M events/s")
    t0 = time.perf_counter()
    events = stepscope.load(run.path).events
    t_load = time.perf_counter() - t0
    assert len(events) == n
    row("read: stepscope.load(run).events (pandas, sorted)", f"{n / t_load / 1e6:.1f}", "M events/s")


def bench_flood_memory(tmp):
    print("memory during a 50 M-event flood (one thread, C++ API, default 32 MiB buffer)")
    code = textwrap.dedent(f"""
        import stepscope
        from stepscope.core import _native
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
        run = stepscope.start(dir={tmp!r}, name="bench-flood")
        before = status("VmRSS")
        ns = _native.bench_cpp_pair(50_000_000, _native.intern("flood"))
        peak = status("VmHWM")
        s = _native.stats()
        run.stop()
        print(peak - before, s["written"], s["dropped"], ns)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    held, written, dropped, ns = float(out[0]), int(out[1]), int(out[2]), float(out[3])
    row("peak memory held by stepscope during the flood", f"{held:.1f}", "MiB")
    row("flood: events written / dropped (counted)", f"{written} / {dropped}", "events", f"{ns:.1f} ns/event")


def main():
    print(f"stepscope {stepscope.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} cpus, clock {_native.clock_info()['source']}")
    with tempfile.TemporaryDirectory() as tmp:
        bench_annotations(tmp)
        bench_training_loop(tmp)
        bench_format_and_reader(tmp)
        bench_flood_memory(tmp)
    print("\n| measurement | value | unit | note |\n| --- | ---: | --- | --- |")
    for what, value, unit, note in rows:
        print(f"| {what.strip()} | {value} | {unit} | {note} |")


if __name__ == "__main__":
    main()
