"""The report's size against the run's length (issue 20: at most 3 MB whatever the length).

    python3 bench/report_size.py [--steps 1000,5000,20000,100000] [--annotations 0,200]
                                 [--gpu-steps 100,1000] [--kernels 300] [--browser]

Writes synthetic runs through the core (per train step four phases, and
`annotations` annotation spans inside Forward and Backward; 1 % of the steps
with a slow GetNext; with --gpu-steps, launch-heavy GPU-shaped runs: a
runtime call and a kernel record per launch, as CUPTI's decoder writes them),
then times `stepscope report` in a fresh process and prints the file's size,
what the timeline kept, and with --browser the time from navigation to the
timeline's first draw and to every plot drawn in Debian's chromium
(Playwright). Prints a Markdown table for BENCHMARKS.md.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CHROMIUM = "/usr/bin/chromium"


def write_run(path, name, steps, annotations):
    """Steps of four phases; `annotations` spans inside Forward and Backward; 1 % slow GetNext."""
    import numpy as np

    import stepscope
    from stepscope.core import _native

    run = stepscope.start(dir=path, name=name, buffer_mb=512, interval_ms=100, gpu="off")
    tpn = _native.clock_info()["ticks_per_ns"]
    phase, ann = stepscope.CATEGORIES.index("phase"), stepscope.CATEGORIES.index("annotation")
    pids = [_native.intern(p) for p in ("GetNext", "Forward", "Backward", "Optimizer")]
    aids = [_native.intern(f"layer{k}") for k in range(20)]
    span, begin = _native.span, _native.begin_step
    slow = np.random.default_rng(0).random(steps) < 0.01
    a_ns, gap, opt = int(4_000 * tpn), int(1_000 * tpn), int(50_000 * tpn)
    t = _native.now()
    for s in range(steps):
        begin("train", t)
        g = int((3_000_000 if slow[s] else 200_000) * tpn)
        span(phase, pids[0], t, t + g)
        t += g + gap
        for p in (1, 2):
            n = annotations // 2
            d = n * (a_ns + gap) + gap
            span(phase, pids[p], t, t + d)
            u = t + gap
            for k in range(n):
                span(ann, aids[k % 20], u, u + a_ns)
                u += a_ns + gap
            t += d + gap
        span(phase, pids[3], t, t + opt)
        t += opt + gap
    run.stop()
    return run.path, run.stats


def write_gpu_run(path, name, steps, kernels):
    """A launch-heavy GPU job's shape without a GPU (the records CUPTI's decoder writes): per step
    a Forward phase launching `kernels` kernels (a runtime call and a kernel each, 1 us apart),
    and an NVML reading of GPU 0 (utilization, memory)."""
    import threading

    import stepscope
    from stepscope.core import gpu_records as rec

    from stepscope.core import _native

    run = stepscope.start(dir=path, name=name, buffer_mb=512, interval_ms=100, gpu="off")
    thread = threading.get_native_id()
    system, gib = stepscope.CATEGORIES.index("system"), float(1 << 30)
    nvml = [_native.intern(f"gpu.{m}|gpu0") for m in ("util", "mem_used", "mem_total")]
    corr = 0
    for s in range(steps):
        stepscope.step()
        at = _native.now()  # one NVML reading a step, as the sampler writes them (for the GPU box plots)
        for name_id, v in zip(nvml, (60.0 + s % 40, (20 + s % 7) * gib, 80 * gib)):
            _native.counter(system, name_id, v, None, at)
        with stepscope.phase("Forward"):
            t0 = time.monotonic_ns()
            for k in range(kernels):
                corr += 1
                rec.api("cudaLaunchKernel", t0 + 1000 * k, t0 + 1000 * k + 400, corr, thread=thread)
                rec.kernel(f"gemm_kernel_{k % 30}", t0 + 20_000 + 1000 * k, t0 + 20_000 + 1000 * k + 800, corr)
            while time.monotonic_ns() < t0 + 1000 * kernels + 40_000:
                pass
    stepscope.end_step()
    run.stop()
    return run.path, run.stats


def report(run_path, out):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stepscope", "report", run_path, "-o", out], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def kept(out):
    text = open(out, encoding="utf-8").read()
    m = re.search(r"id='tl-data'>(.*?)</script>", text)
    meta = json.loads(m.group(1))["meta"]
    return meta["spans"], meta["items"], len(meta["detail_steps"])


def open_time(browser, out):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    t = time.perf_counter()
    page.goto("file://" + out, timeout=60_000)
    page.wait_for_function("window.stepscopeTimeline && window.stepscopeTimeline.ready")
    ready = time.perf_counter() - t
    page.evaluate("window.stepscopeDrawPlots()")
    n = page.locator("div.plot").count()
    page.wait_for_function(f"document.querySelectorAll('div.plot .main-svg').length >= {n}", timeout=60_000)
    plots = time.perf_counter() - t
    page.close()
    return ready, plots


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="1000,5000,20000,100000")
    p.add_argument("--annotations", default="0,200")
    p.add_argument("--gpu-steps", default="", help="also launch-heavy GPU-shaped runs of these lengths, e.g. 100,1000")
    p.add_argument("--kernels", type=int, default=300, help="kernels a step in the GPU-shaped runs")
    p.add_argument("--browser", action="store_true")
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    try:
        for annotations in map(int, args.annotations.split(",")):
            for steps in map(int, args.steps.split(",")):
                name = f"s{steps}-a{annotations}"
                run_path, _ = write_run(tmp, name, steps, annotations)
                out = os.path.join(tmp, name + ".html")
                seconds = report(run_path, out)
                rows.append((steps, annotations, out, seconds, *kept(out)))
                print(f"  {name}: {os.path.getsize(out) / 1e6:.2f} MB in {seconds:.1f} s", file=sys.stderr, flush=True)
        for steps in [int(s) for s in args.gpu_steps.split(",") if s]:
            name = f"gpu{steps}-k{args.kernels}"
            run_path, _ = write_gpu_run(tmp, name, steps, args.kernels)
            out = os.path.join(tmp, name + ".html")
            seconds = report(run_path, out)
            rows.append((steps, f"{args.kernels} kernels", out, seconds, *kept(out)))
            print(f"  {name}: {os.path.getsize(out) / 1e6:.2f} MB in {seconds:.1f} s", file=sys.stderr, flush=True)
        opened = {}
        if args.browser:
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM,
                                             args=["--headless", "--no-sandbox", "--disable-gpu"])
                for r in rows:
                    opened[r[2]] = open_time(browser, r[2])
                browser.close()
        print("| train steps | a step | spans | report | `stepscope report` | timeline items "
              "| steps in full detail |" + (" open (timeline drawn) | every plot drawn |" if opened else ""))
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if opened else ""))
        for steps, annotations, out, seconds, spans, items, detail in rows:
            shape = annotations if isinstance(annotations, str) else f"{annotations} annotations"
            line = (f"| {steps:,} | {shape} | {spans:,} | {os.path.getsize(out) / 1e6:.2f} MB | {seconds:.1f} s "
                    f"| {items:,} | {detail} |")
            if opened:
                line += f" {opened[out][0]:.2f} s | {opened[out][1]:.2f} s |"
            print(line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
