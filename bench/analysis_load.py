"""Analysis speed: load a 10 M-event run and evaluate every rule.

    python3 bench/analysis_load.py [--events 10000000]

Writes a synthetic run through the core (step marks and five phases per step,
as the PyTorch integration records them, plus the sampler's system metrics),
then, in a fresh process, times stepscope.load(...) with the steps, phases
and system tables and every rule, and reports the peak memory (VmHWM). The
second load reads the Parquet cache. Twice in memory (the events table
built), twice through the run's Parquet dataset (analysis/store/dataset_build.py: the
trace decoded a part at a time, no events table).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time


def write_run(path, events):
    import numpy as np

    import stepscope
    from stepscope.core import _native

    run = stepscope.start(dir=path, name="big", buffer_mb=512, interval_ms=100)
    tpn = _native.clock_info()["ticks_per_ns"]
    phase = stepscope.CATEGORIES.index("phase")
    ids = [_native.intern(p) for p in ("GetNext", "Forward", "Loss", "Backward", "Optimizer")]
    steps = events // 6
    rng = np.random.default_rng(0)
    durs = (rng.integers(50_000, 400_000, size=(steps, 5)) * tpn).astype(np.int64).tolist()
    gap = int(2_000 * tpn)
    span, now, begin = _native.span, _native.now, _native.begin_step
    t = now()
    for s in range(steps):
        begin("train", t)
        for pid, d in zip(ids, durs[s]):
            span(phase, pid, t, t + d)
            t += d + gap
    run.stop()
    return run.path, run.stats


MEASURE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import stepscope
    from stepscope.analysis.rules import evaluate
    through = sys.argv[2] == "dataset"
    r = stepscope.load(sys.argv[1], quiet=True, dataset=through)
    n = int(r.extents()["events"].sum()) if through else len(r.events)
    t_events = time.perf_counter() - t0
    steps, phases, system = r.steps, r.phases, r.system
    t_tables = time.perf_counter() - t0
    result = evaluate(r)
    t_all = time.perf_counter() - t0
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
    print(json.dumps({"events": n, "steps": len(steps), "events_s": t_events, "tables_s": t_tables,
                      "total_s": t_all, "peak_mib": hwm, "findings": len(result["findings"])}))
""")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10_000_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path, stats = write_run(tmp, args.events)
        print(f"wrote {stats['written']:,} events ({stats['dropped']} dropped) in {time.perf_counter() - t:.1f} s, "
              f"{stats['bytes'] / stats['written']:.2f} bytes/event")
        print("| load | events | steps | events table | + steps, phases, system | + all rules | peak memory |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for label, how in (("in memory, first (decode, write Parquet cache)", "memory"),
                           ("in memory, second (Parquet cache)", "memory"),
                           ("dataset, first (decode a part at a time, write the dataset)", "dataset"),
                           ("dataset, second (cached dataset)", "dataset")):
            out = subprocess.run([sys.executable, "-c", MEASURE, path, how], capture_output=True, text=True,
                                 check=True)
            m = json.loads(out.stdout)
            print(f"| {label} | {m['events']:,} | {m['steps']:,} | {m['events_s']:.1f} s | {m['tables_s']:.1f} s "
                  f"| {m['total_s']:.1f} s | {m['peak_mib']:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
