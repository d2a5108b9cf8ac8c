"""Analysis at GPU-trace scale: a synthetic multi-rank run, then summary, rules and report timed.

    python3 bench/scale.py [--events 50000000] [--ranks 8] [--keep DIR]

Writes a run through the native record paths, one process per rank (in
parallel, ``RANK``/``WORLD_SIZE`` set as torchrun does): 50 ms train steps of
five phases, each step launching kernels (``cudaLaunchKernel`` API records and
kernel records ``latency`` later), a host-to-device copy, and NVML-style GPU
gauges (utilisation, memory, power) every 100 ms; the real system sampler runs
alongside. The number of kernels per step is chosen so the run holds about
``--events`` records (kernels are most of them, as in a real GPU trace).

Then, each in a fresh process: ``stepscope summary --json`` with every rule
(first: decodes the traces into the run's Parquet dataset; second: reads the
cached dataset), and ``stepscope report``. Printed per command: wall time and
the peak memory of the command's whole process tree (dataset workers
included), sampled every 20 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

STEP_NS = 50_000_000
PHASES = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
SHARES = (0.06, 0.30, 0.02, 0.50, 0.12)  # of a step, in order
PER_STEP_FIXED = 1 + len(PHASES) + 2  # step mark, phases, a copy and its API call

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import stepscope
    from stepscope.core import _native, gpu_records as rec

    root, name, steps, kernels = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rank, step_ns = int(sys.argv[5]), int(sys.argv[6])
    phases, shares = {phases!r}, {shares!r}
    run = stepscope.start(dir=root, name=name, buffer_mb=256, interval_ms=100, gpu="off")
    tpn = _native.clock_info()["ticks_per_ns"]
    phase_cat = _native.CATEGORIES.index("phase")
    system_cat = _native.CATEGORIES.index("system")
    ids = [_native.intern(p) for p in phases]
    gauges = [_native.intern(f"gpu.{{g}}|gpu{{rank}}") for g in ("util", "mem_used", "power_mw")]
    kernel_names = [_native.intern(n) for n in ("ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_"
                                                "kernel<4, at::native::AddFunctor<float> >(int)",
                                                "_Z25multi_tensor_apply_kernelIfEvPT_")]
    launch = _native.intern("cudaLaunchKernel")
    copy_api = _native.intern("cudaMemcpyAsync")
    cfg = _native.launch_config((80, 1, 1), (128, 1, 1), 64)
    span, begin, gpu, counter = _native.span, _native.begin_step, _native.gpu_record, _native.counter
    rng = np.random.default_rng(rank)
    jitter = rng.normal(1.0, 0.03, size=steps).clip(0.8, 1.3)
    import time
    t_ns = time.monotonic_ns()
    corr = 1
    next_gauge = t_ns
    for s in range(steps):
        length = int(step_ns * jitter[s])
        begin("train", int(t_ns * tpn))
        t = t_ns
        for pid, share in zip(ids, shares):
            d = int(length * share)
            span(phase_cat, pid, int(t * tpn), int((t + d) * tpn))
            if pid in (ids[1], ids[3], ids[4]):  # Forward, Backward, Optimizer launch kernels
                n = kernels // 3
                gap = max(d // (n + 1), 1)
                for k in range(n):
                    at = t + k * gap
                    gpu(4, at, at + 4_000, corr, 0, 0, launch, thread=1)
                    gpu(0, at + 20_000, at + 20_000 + gap // 2, corr, rank % 8, 7, kernel_names[k % 3], config=cfg)
                    corr += 1
            elif pid == ids[0] and kernels:  # the batch goes to the GPU
                gpu(4, t + d - 30_000, t + d - 20_000, corr, 0, 0, copy_api, thread=1)
                gpu(1, t + d - 10_000, t + d, corr, rank % 8, 7, 0, sub=1, sub2=1 | 3 << 4, bytes=4 << 20)
                corr += 1
            t += d
        t_ns += length
        while kernels and next_gauge < t_ns:  # NVML-style gauges every 100 ms
            at = int(next_gauge * tpn)
            counter(system_cat, gauges[0], float(rng.uniform(70, 95)), None, at)
            counter(system_cat, gauges[1], float(30e9 + s), None, at)
            counter(system_cat, gauges[2], float(rng.uniform(250e3, 400e3)), None, at)
            next_gauge += 100_000_000
    _native.end_step(int(t_ns * tpn))
    run.stop()
    print(run.stats["written"], run.stats["dropped"], run.stats["bytes"])
""").format(phases=PHASES, shares=SHARES)


def write_run(root: str, events: int, ranks: int, hours: float, cpu_only: bool = False):
    """Writes the run (one process per rank, two at a time); returns (path, records, bytes)."""
    steps = int(hours * 3600e9 / STEP_NS)
    per_rank = events / ranks
    kernels = max(3, int(round((per_rank / steps - PER_STEP_FIXED) / 2 / 3)) * 3)
    step_ns = STEP_NS
    if cpu_only:  # a step mark and five phases a step
        steps, kernels, step_ns = int(per_rank // 6), 0, 1_000_000
    elif per_rank / steps < PER_STEP_FIXED + 6:  # too few events for an hour: fewer steps instead
        steps = max(10, int(per_rank / (PER_STEP_FIXED + 6)))
        kernels = 3
    name = "scale"
    written = dropped = size = 0
    procs = []
    for rank in range(ranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), STEPSCOPE_RUN=name,
                   STEPSCOPE_PYSAMPLE_HZ="0", STEPSCOPE_OPS="0",
                   STEPSCOPE_FLUSH_MS="50")  # the GPU record queue drains 20 times a second
        procs.append(subprocess.Popen([sys.executable, "-c", WRITER, root, name, str(steps), str(kernels),
                                       str(rank), str(step_ns)], env=env, stdout=subprocess.PIPE, text=True))
        if len(procs) >= (os.cpu_count() or 2):
            w, d, b = _finish(procs.pop(0))
            written, dropped, size = written + w, dropped + d, size + b
    for p in procs:
        w, d, b = _finish(p)
        written, dropped, size = written + w, dropped + d, size + b
    return os.path.join(root, name), written, dropped, size, steps, kernels


def _finish(proc):
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"a writer failed ({proc.returncode})")
    w, d, b = (int(x) for x in out.split())
    return w, d, b


def measure(cmd, env=None) -> dict:
    """Wall time and the peak total RSS of the process tree of ``cmd``."""
    import psutil

    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {"wall_s": time.perf_counter() - t, "peak_mib": peak / 2**20, "stdout": out}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=50_000_000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hours", type=float, default=1.0, help="length of the synthetic run")
    p.add_argument("--cpu-only", action="store_true",
                   help="step marks and five phases only (no GPU records, no gauges): --events / 6 steps, 1 ms each")
    p.add_argument("--keep", help="write the run here and keep it (default: a temporary folder)")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--run", help="time the analysis of this run (one --keep wrote earlier) instead of writing one")
    args = p.parse_args()
    tmp = None if args.keep or args.run else tempfile.TemporaryDirectory()
    root = args.keep or (os.path.dirname(os.path.abspath(args.run)) if args.run else tmp.name)
    if args.run:  # its first read is timed again: the dataset cached by an earlier read goes
        path, written = args.run, 0
        shutil.rmtree(os.path.join(path, ".stepscope-cache"), ignore_errors=True)
    else:
        t = time.perf_counter()
        path, written, dropped, size, steps, kernels = write_run(root, args.events, args.ranks, args.hours,
                                                                  args.cpu_only)
        print(f"wrote {written:,} records ({dropped:,} dropped) over {args.ranks} ranks in "
              f"{time.perf_counter() - t:.0f} s: {steps:,} steps per rank, {kernels} kernels per step, "
              f"{size / 2**20:,.0f} MiB of traces ({size / max(written, 1):.2f} bytes/record)", flush=True)
    summary = [sys.executable, "-m", "stepscope", "summary", "--json", path]
    rows = [("summary, every rule (first: builds the dataset)", measure(summary)),
            ("summary, every rule (cached dataset)", measure(summary))]
    if not args.no_report:
        rows.append(("report (cached dataset)", measure([sys.executable, "-m", "stepscope", "report", path,
                                                          "-o", os.path.join(root, "report.html")])))
    s = json.loads(rows[0][1]["stdout"])
    print(f"summary: {s['steps']['train']['count']:,} train steps, ranks {s['ranks']}, "
          f"findings {[f['rule'] for f in s['findings']]}")
    what = f"{written / 1e6:,.0f} M records, {args.ranks} ranks" if written else os.path.basename(path)
    print(f"\n| {what} | wall | peak memory (process tree) |")
    print("| --- | ---: | ---: |")
    for label, m in rows:
        print(f"| {label} | {m['wall_s']:.1f} s | {m['peak_mib']:,.0f} MiB |")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
