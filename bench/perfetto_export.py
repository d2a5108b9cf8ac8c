"""Perfetto export speed and size: the protobuf trace against the gzip Chrome JSON.

    python3 bench/perfetto_export.py [--events 10000000] [--no-json]

Writes a synthetic run (bench/analysis_load.py's: step marks and five phases a
step), loads it once (the Parquet cache), then times `export(run, "perfetto")`
and, unless --no-json, the gzip JSON of the same events (`-o trace.json.gz`).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from analysis_load import write_run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--no-json", action="store_true")
    args = p.parse_args()
    import stepscope
    from stepscope.analysis.export.formats import export

    with tempfile.TemporaryDirectory() as tmp:
        path, stats = write_run(tmp, args.events)
        run = stepscope.load(path, quiet=True)
        n, steps = len(run.events), len(run.steps)
        print(f"run: {stats['written']:,} events written, {n:,} rows, {steps:,} steps")
        rows = []
        formats = [("perfetto protobuf", None)] + ([] if args.no_json else [("gzip Chrome JSON", "trace.json.gz")])
        for label, name in formats:
            t = time.perf_counter()
            out = export(run, "perfetto", os.path.join(tmp, name) if name else None)
            rows.append((label, time.perf_counter() - t, os.path.getsize(out)))
        print("| format | time | size | bytes/event |")
        print("| --- | ---: | ---: | ---: |")
        for label, s, size in rows:
            print(f"| {label} | {s:.1f} s | {size / 2**20:.0f} MiB | {size / n:.1f} |")
        if len(rows) == 2:
            print(f"protobuf / gzip JSON: size {rows[0][2] / rows[1][2]:.2f}x, time {rows[0][1] / rows[1][1]:.3f}x")


if __name__ == "__main__":
    main()
