"""Training loops whose last iteration never reaches its optimizer step (no stepscope in
here): python interrupted.py KIND. 8 batches of 8, an SGD step each, unless KIND stops one:

* ctrl_c: Ctrl-C (SIGINT) during the 6th forward; the program's handler saves and exits 0
* forward_raises / backward_raises: the 6th forward (backward) raises, uncaught: exit 1
* skip_bad_batch: the 3rd forward raises, the loop skips that batch and goes on: 7 steps
"""
import signal
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

KIND = sys.argv[1]
BAD = 3 if KIND == "skip_bad_batch" else 6


class Fails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == BAD:
            time.sleep(0.05)  # the interrupted iteration's time is real: it stays on the timeline
            if KIND == "ctrl_c":
                signal.raise_signal(signal.SIGINT)
            elif KIND in ("forward_raises", "skip_bad_batch"):
                raise ValueError("bad batch")
            elif KIND == "backward_raises":
                return Fails.apply(self.body(x))
        return self.body(x)


# Ctrl-C raises KeyboardInterrupt even where the parent ignores SIGINT (a shell's background
# job starts its children so, and Python then keeps it ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randn(64, 1)), batch_size=8)
steps = 0
try:
    for x, y in data:
        opt.zero_grad()
        try:
            loss = nn.functional.mse_loss(model(x), y)
        except ValueError:
            if KIND != "skip_bad_batch":
                raise
            continue
        loss.backward()
        opt.step()
        steps += 1
except KeyboardInterrupt:
    print("interrupted")
print("optimizer steps", steps, flush=True)
