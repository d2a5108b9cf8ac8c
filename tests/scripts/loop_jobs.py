"""Training loops for the loop notes (analysis/loop.py): python loop_jobs.py KIND.

zeroth:        zeroth-order training (SPSA): two forwards of the model under grad with
               perturbed weights, then a hand-made update of p.data; no backward, no
               optimizer, so stepscope cannot tell the iterations apart.
zeroth_marked: the same loop with stepscope.step() at the top of each iteration.
normal:        forward, loss, backward, optimizer step: 40 ordinary steps.
fails:         stops at a missing data file before its loop begins.
scratch:       "What is torch.nn really?": weights in plain tensors, `xb @ weights + bias`,
               a backward and a hand-made SGD update: 24 steps, no nn.Module, no optimizer.
"""
import sys
import time

import torch
import torch.nn as nn

ITERATIONS = 150


def zeroth(mark):
    if mark:
        import stepscope
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    x, y = torch.randn(256, 64), torch.randn(256, 1)
    eps, lr = 1e-3, 1e-3
    for _ in range(ITERATIONS):
        if mark:
            stepscope.step()
        z = [torch.randn_like(p) for p in m.parameters()]
        for p, d in zip(m.parameters(), z):
            p.data.add_(eps * d)
        plus = nn.functional.mse_loss(m(x), y).item()
        for p, d in zip(m.parameters(), z):
            p.data.sub_(2 * eps * d)
        minus = nn.functional.mse_loss(m(x), y).item()
        g = (plus - minus) / (2 * eps)
        for p, d in zip(m.parameters(), z):
            p.data.add_(eps * d - lr * g * d)
        time.sleep(0.03)  # the rest of an iteration (logging, a slower model)


def normal():
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x, y = torch.randn(256, 64), torch.randn(256, 1)
    for _ in range(40):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        time.sleep(0.005)


def scratch():
    weights = (torch.randn(64, 4) / 8).requires_grad_()
    bias = torch.zeros(4, requires_grad=True)
    x, y = torch.randn(512, 64), torch.randint(0, 4, (512,))
    for epoch in range(3):
        for i in range(8):
            xb, yb = x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]
            loss = nn.functional.cross_entropy(xb @ weights + bias, yb)
            loss.backward()
            with torch.no_grad():
                weights -= weights.grad * 0.1
                bias -= bias.grad * 0.1
                weights.grad.zero_()
                bias.grad.zero_()


def main(kind):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if kind == "fails":
        with open("data/train.csv") as f:  # not there: the job stops before its loop
            f.read()
    elif kind == "normal":
        normal()
    elif kind == "scratch":
        scratch()
    else:
        zeroth(mark=kind == "zeroth_marked")
    print("done", kind)


if __name__ == "__main__":
    main(sys.argv[1])
