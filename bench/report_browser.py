"""The report of a large run: written, opened in headless Chromium, zoomed.

    python3 bench/report_browser.py [--events 10000000] [--run PATH]

Writes a synthetic run through the core (as bench/analysis_load.py does: step
marks and five phases per step), then times `stepscope report` in a fresh
process (first with the events decoded from the traces, then with the Parquet
cache), opens the file in Debian's chromium through Playwright (load event
and the timeline's first draw) and zooms the timeline from the whole run down
to a single step, reading each redraw's time from the page (performance.now()
around the draw). Targets: report <= 15 s, open <= 5 s, redraw <= 100 ms.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHROMIUM = "/usr/bin/chromium"


def time_report(run_path, out):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stepscope", "report", run_path, "-o", out], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def browse(path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        t = time.perf_counter()
        page.goto("file://" + path, timeout=120_000)
        page.wait_for_function("window.stepscopeTimeline && window.stepscopeTimeline.ready")
        opened = time.perf_counter() - t
        page.locator("#timeline").scroll_into_view_if_needed()
        draws = [page.evaluate("window.stepscopeTimeline.setView(0, 1e18)")]  # the whole run
        for _ in range(40):  # halve the view 40 times: whole run to a few microseconds
            draws.append(page.evaluate("window.stepscopeTimeline.zoom(0.5)"))
        for _ in range(10):
            draws.append(page.evaluate("window.stepscopeTimeline.zoom(2.5)"))
        page.evaluate("window.stepscopeTimeline.zoomToStep(1000)")
        draws.append(page.evaluate("window.stepscopeTimeline.lastDrawMs"))
        items = page.evaluate("window.stepscopeTimeline.items")
        browser.close()
    return opened, draws, items, errors


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--run", help="an existing run instead of a synthetic one")
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        if args.run:
            run_path = args.run
        else:
            from analysis_load import write_run

            t = time.perf_counter()
            run_path, stats = write_run(tmp, args.events)
            print(f"wrote {stats['written']:,} events in {time.perf_counter() - t:.1f} s")
            cache = os.path.join(run_path, ".stepscope-cache")
            shutil.rmtree(cache, ignore_errors=True)
        out = os.path.join(tmp, "report.html")
        first = time_report(run_path, out)
        second = time_report(run_path, out)
        size = os.path.getsize(out) / 2**20
        opened, draws, items, errors = browse(out)
        print("| events | report (decode) | report (cached) | file | open in Chromium | timeline items "
              "| redraw median | redraw max |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        print(f"| {args.events:,} | {first:.1f} s ({first / 15:.2f} of 15 s) | {second:.1f} s | {size:.0f} MiB "
              f"| {opened:.1f} s ({opened / 5:.2f} of 5 s) | {items:,} | {statistics.median(draws):.1f} ms "
              f"| {max(draws):.1f} ms ({max(draws) / 100:.2f} of 100 ms) |")
        if errors:
            print("page errors:", errors)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
