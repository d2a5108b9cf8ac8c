"""A job that crashes: the learning rate is too high, and the script's own divergence
check raises after an optimizer step; the exit code and the exception are the job's
own, and the steps before the crash are recorded."""
# expect: {"exit": 1, "train": 5, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.3)
data = DataLoader(TensorDataset(torch.randn(128, 8) * 3, torch.randn(128, 1)), batch_size=8)
for step, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}", flush=True)
    if not math.isfinite(loss.item()) or loss.item() > 1e6:
        raise FloatingPointError(f"loss diverged at step {step}")
