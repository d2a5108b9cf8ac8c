"""Cost of the torch operator windows (integrations/torch/_ops.py) under the default policy.

    python bench/op_windows.py [steps] [hidden]

Trains a small MLP on CPU (batch 16, Adam, a DataLoader) for `steps` steps under
stepscope, then prints every window (its steps, ops written, its cost: the wall time
from opening to written ops less what its steps took unprofiled, and the close alone)
and the windows' total cost as a share of the loop's time. The same loop is run
with windows turned off (STEPSCOPE_STEPS past the end) to compare wall times,
alternating, best of three each.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time


def loop(steps: int, hidden: int, windows: bool) -> tuple:
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import stepscope
    from stepscope.integrations.torch import _ops

    with tempfile.TemporaryDirectory() as d:
        session = stepscope.start(dir=d, name="bench", steps=None if windows else f"{10 ** 9}-{10 ** 9}")
        import stepscope.integrations.torch as st_torch

        st_torch.instrument()
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 4))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        lossf = nn.CrossEntropyLoss()
        data = DataLoader(TensorDataset(torch.randn(16 * steps, 32), torch.randint(0, 4, (16 * steps,))),
                          batch_size=16)
        t0 = time.perf_counter_ns()
        for x, y in data:
            opt.zero_grad()
            lossf(model(x), y).backward()
            opt.step()
        wall = time.perf_counter_ns() - t0
        stats = list(_ops.windows().stats) if _ops.windows() else []
        st_torch.uninstrument()
        session.stop()
    return wall, stats


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    os.environ.pop("STEPSCOPE", None)
    from stepscope.core import _native

    tpn = _native.clock_info()["ticks_per_ns"]
    # alternated, best of three each: the machine's load moves more than 1%
    walls, bases, stats = [], [], []
    for _ in range(3):
        base, _ = loop(steps, hidden, False)
        wall, got = loop(steps, hidden, True)
        bases.append(base)
        if not walls or wall < min(walls):
            stats = got
        walls.append(wall)
    wall, base = min(walls), min(bases)
    cost = sum(s["cost_ticks"] for s in stats) / tpn
    print(f"{steps} steps, hidden {hidden}: loop {wall / 1e9:.2f} s with windows, {base / 1e9:.2f} s without "
          f"({100 * (wall - base) / base:+.2f}%), {wall / steps / 1e3:.0f} us a step")
    for s in stats:
        print(f"  steps {s['first']}-{s['last']}: {s['ops']} ops, cost {s['cost_ticks'] / tpn / 1e6:.1f} ms "
              f"(close and write {s['close_ticks'] / tpn / 1e6:.1f} ms)")
    print(f"windows: {len(stats)}, {cost / 1e6 / max(len(stats), 1):.1f} ms a window, "
          f"{100 * cost / wall:.2f}% of the loop")


if __name__ == "__main__":
    main()
