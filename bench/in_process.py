"""What each part of stepscope costs a training step, measured in one process (issue 61).

    python3 bench/in_process.py [--width 64] [--batch 32] [--steps 400] [--skip 60] [--rounds 20]

``bench/whole_process.py`` measures what a user sees, whole processes plain and profiled;
two processes of the same script differ by up to ±100 us of CPU a step on this VM (memory
layout, the CPU they land on), which hides parts that cost a few us. Here one process runs
the same training loop in chunks of ``--steps`` steps: in every round, each configuration
(everything on, each part turned off in turn, the hooks alone) runs a chunk beside a plain
chunk (no session), the pair in a random order, the configurations shuffled: what is
compared is two chunks a second apart. A session is started and stopped around its chunk
(outside the timing: only the steps are timed), the torch integration instrumented and
uninstrumented with it, as ``STEPSCOPE=1`` does; the first ``--skip`` steps of every chunk
are not timed (a session's start: its first op window, at train steps 5-7, is paid once a
run, not once a chunk). Per configuration: the median over rounds
of (its chunk's time less the plain chunk's beside it) per step, p10 and p90, and
the same for the process's CPU time (every thread's: the samplers' and the writer's).

The model: ``bench/whole_process.py``'s job (an 8-layer MLP at one torch thread, SGD, a
DataLoader over in-memory tensors).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile

from whole_process import PARTS as WHOLE_PROCESS_PARTS, training  # (bench/ is the script's folder: on sys.path)

# configuration -> the variables it sets: everything on, and whole_process.py's parts turned off
PARTS = {"everything on": {}, **WHOLE_PROCESS_PARTS}


def chunk(run, steps: int, skip: int, config, out_dir: str):
    """One chunk under ``config`` (None: plain): (wall s, CPU s) of its steps alone, after
    ``skip`` steps (a session's start-up: its first op window at train steps 5-7)."""
    if config is None:
        run(skip)  # (as the profiled chunks)
        return run(steps)
    import stepscope
    from stepscope.integrations import torch as st_torch

    saved = {k: os.environ.get(k) for k in PARTS["hooks only"]}
    os.environ.update(PARTS[config])
    try:
        session = stepscope.start(dir=out_dir, gpu="off")
        st_torch.instrument()
        run(skip)  # the first steps find the model and the loop; the first op window
        timed = run(steps)
        st_torch.uninstrument()
        session.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return timed


def _deciles(values: list) -> list:
    return statistics.quantiles(values, n=10) if len(values) >= 2 else [values[0]] * 9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400, help="timed steps per chunk")
    parser.add_argument("--skip", type=int, default=60, help="steps before the timed ones, every chunk")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    a = parser.parse_args()
    configs = [c for c in PARTS if not a.only or c in a.only.split(",")]
    run = training(a.width, a.batch)
    run(50)  # warm
    # per configuration: (its chunk, the plain chunk beside it) of each round, in a random order
    walls = {c: [] for c in configs}
    cpus = {c: [] for c in configs}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = list(configs)
            rng.shuffle(order)
            for c in order:
                pair = [None, c]
                rng.shuffle(pair)
                got = {which: chunk(run, a.steps, a.skip, which, tmp) for which in pair}
                walls[c].append((got[c][0] / a.steps, got[None][0] / a.steps))
                cpus[c].append((got[c][1] / a.steps, got[None][1] / a.steps))
            print(f"round {r + 1}/{a.rounds}", end="\r", flush=True)
    plain = [p for c in configs for _, p in walls[c]]
    q = _deciles(plain)
    print(f"width {a.width}, batch {a.batch}: plain step {statistics.median(plain) * 1e3:.3f} ms (median; p10 "
          f"{q[0] * 1e3:.3f}, p90 {q[-1] * 1e3:.3f}); {a.rounds} rounds, each configuration's chunk of "
          f"{a.steps} steps beside a plain one")
    print("| configuration | per step, median (p10, p90) | ratio | CPU per step, median (p10, p90) |")
    print("| --- | ---: | ---: | ---: |")

    def dist(values):
        q = _deciles(values)
        return f"{statistics.median(values) * 1e6:+.1f} us ({q[0] * 1e6:+.1f}, {q[-1] * 1e6:+.1f})"

    for c in configs:
        ratio = statistics.median(w / p for w, p in walls[c])
        print(f"| {c} | {dist([w - p for w, p in walls[c]])} | {ratio:.4f}x | {dist([w - p for w, p in cpus[c]])} |")


if __name__ == "__main__":
    main()
