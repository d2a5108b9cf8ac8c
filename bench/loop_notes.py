"""The summary's loop notes on a long run: `undelimited_steps` over 1.67 M steps.

    python3 bench/loop_notes.py [--events 10000000] [--run PATH]

Writes the synthetic run of bench/analysis_load.py (step marks and five phases
per step) unless --run names one, loads its steps and phases tables, then
times `analysis.loop.undelimited_steps` and `run_loop_notes` (best of three).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--run", help="an existing run instead of writing one")
    args = p.parse_args()
    import stepscope
    from stepscope.analysis.loop import run_loop_notes, undelimited_steps

    path = args.run
    if path is None:
        from analysis_load import write_run

        path, _ = write_run(tempfile.mkdtemp(), args.events)
    r = stepscope.load(path, quiet=True)
    steps, phases, events = r.steps, r.phases, r.events
    spans = events.groupby(events["process"].astype(str)).agg(start=("start_ns", "min"), end=("end_ns", "max"))
    profiled = {q: int(row.end - row.start) for q, row in spans.iterrows()}
    times = []
    for _ in range(3):
        t = time.perf_counter()
        found = undelimited_steps(steps, phases, profiled)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    notes = run_loop_notes(r)
    print(json.dumps({"run": path, "steps": len(steps), "phases": len(phases),
                      "undelimited_steps_s": round(min(times), 3),
                      "run_loop_notes_s": round(time.perf_counter() - t, 3),
                      "found": found, "notes": [n["key"] for n in notes]}))


if __name__ == "__main__":
    main()
