"""Training jobs whose host memory grows, for HostMemoryIncrease: python memory_jobs.py KIND.

warmup: 32 MiB more a step for the first 30 of 150 steps (a cache filled while warming
        up, kept for good), then flat: a healthy job.
late:   flat for 40 steps, then 8 MiB a step for the 110 steps after: a leak that starts
        after a warm-up.
shortwindow: 60 steps (~10 ms) that keep 8 MiB a step: the steady state lasts about a
        second, too short to extrapolate a rate in time, but memory grows by the same
        amount at every step: a leak by its steps.
shortjump: 60 steps (~10 ms) in which memory jumps once by 480 MiB, at step 30 (a
        second model built): too short to judge a trend, and no growth every step.
"""
import sys
import time

import torch
import torch.nn as nn

MiB = 1 << 20


def main(kind):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    kept = []
    for i in range(60 if kind.startswith("short") else 150):
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        if kind == "warmup" and i < 30:
            kept.append(torch.ones(32 * MiB // 4))  # touched: resident at once
        elif kind == "late" and i >= 40:
            kept.append(torch.ones(8 * MiB // 4))
        t = torch.randn(256, 256)
        for _ in range(12):  # some steady work per step (~10 ms)
            t = torch.tanh(t @ t) * 0.5
        if kind == "shortwindow":
            kept.append(torch.ones(8 * MiB // 4))
        if kind == "shortjump" and i == 30:
            kept.append(torch.ones(480 * MiB // 4))
        if kind.startswith("short"):
            continue
        time.sleep(0.035)  # a loop long enough to judge: the steady state lasts over 5 s (min_window_s)
    print("done", kind, len(kept))


if __name__ == "__main__":
    main(sys.argv[1])
