"""A train loop left mid-iteration, then an evaluation; and an iteration that reads a loader
of its own (no stepscope in here): python left_loops.py KIND.

* caught: the 6th iteration raises after its fetch and zero_grad; the program catches it
  outside the loop and evaluates (4 eval batches): 5 train steps, 1 interrupted, 4 eval
* break: the same loop left with break after the 6th fetch: the same counts
* inner_loader: each of 6 iterations also runs over a small reference loader of its own
  before its backward (a regulariser's data): 6 train steps, none interrupted
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

KIND = sys.argv[1]
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
reference = TensorDataset(torch.randn(16, 8))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = evals = 0


def train():
    global steps
    for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        opt.zero_grad()
        if i == 5 and KIND == "caught":
            raise ValueError("bad batch")
        if i == 5 and KIND == "break":
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        if KIND == "inner_loader":
            for (r,) in DataLoader(reference, batch_size=8):
                loss = loss + 1e-3 * model(r).pow(2).mean()
        loss.backward()
        opt.step()
        steps += 1
        if KIND == "inner_loader" and steps == 6:
            return


try:
    train()
except ValueError:
    pass
model.eval()
with torch.no_grad():
    for x, _ in DataLoader(data, batch_size=16):
        model(x)
        evals += 1
print("optimizer steps", steps, "eval batches", evals)
