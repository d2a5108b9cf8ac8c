"""The first read's memory held to its figure (issue 73): one process's dataset build, on a
synthetic CPU run written by bench/scale.py's writer, allocates at most 10% more than it did
when this test was written (99 bytes an event at its peak, BENCHMARKS.md "The first read's
memory back"). Python and NumPy allocations are counted with tracemalloc: the same figure on
any machine and under any load, unlike a process's RSS (which the scale benchmark reports).
A categorical column turned into an object array of every event (a loop mark's look-up did
that, issue 73's regression) costs 34 bytes an event more: this test fails on it."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BYTES_PER_EVENT = 99  # peak traced bytes / events, measured on 32a1e42 + the loop-marks fix
ALLOWED = 1.10

PROBE = textwrap.dedent("""
    import os, sys, tempfile, tracemalloc
    sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
    from scale import write_run
    from stepscope.analysis.store.dataset_build import build_process
    from stepscope.analysis.tables.catalog import catalog
    root = tempfile.mkdtemp(dir=sys.argv[2])
    path, written, *_ = write_run(root, 600_000, 1, 1.0, True)
    folder = [os.path.join(path, d) for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))][0]
    recipes = catalog()
    tracemalloc.start()
    entry = build_process(folder, tempfile.mkdtemp(dir=sys.argv[2]), recipes)
    print(entry["events"], entry["rows"]["steps"], tracemalloc.get_traced_memory()[1])
""")


def test_one_process_build_peak_allocations_per_event(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-c", PROBE, REPO, str(tmp_path)], capture_output=True, text=True,
                       timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    events, steps, peak = (int(x) for x in r.stdout.split()[-3:])
    assert events >= 600_000 and steps == 100_000  # a step mark and five phases a step (and the sampler)
    per_event = peak / events
    assert per_event <= BYTES_PER_EVENT * ALLOWED, (
        f"the build's peak allocations are {per_event:.0f} bytes an event, over {BYTES_PER_EVENT} + 10%")
