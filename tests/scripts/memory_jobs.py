"""Training jobs whose host memory grows, for HostMemoryIncrease: python memory_jobs.py KIND.

warmup: 32 MiB more a step for the first 30 of 150 steps (a cache filled while warming
        up, kept for good), then flat: a healthy job.
late:   flat for 40 steps, then 8 MiB a step for the 110 steps after: a leak that starts
        after a warm-up.
shortwindow: 60 steps (~10 ms) that fill an 8 MiB-a-step cache for the epoch: the steady
        state lasts about a second, too short to tell a leak from a one-off fill, such as
        DataLoader workers started again at an epoch faulting in their memory.
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
    for i in range(60 if kind == "shortwindow" else 150):
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
            continue
        time.sleep(0.035)  # a loop long enough to judge: the steady state lasts over 5 s (min_window_s)
    print("done", kind, len(kept))


if __name__ == "__main__":
    main(sys.argv[1])
