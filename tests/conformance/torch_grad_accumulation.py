"""Gradient accumulation: 4 micro-batches per optimizer step (16 batches, 4 steps);
a train step is an optimizer step."""
# expect: {"train": 4, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 16, "Optimizer": 4}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
ACCUM = 4
opt.zero_grad()
for i, (x, y) in enumerate(data):
    loss = nn.functional.mse_loss(model(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        opt.step()
        opt.zero_grad()
print(f"loss {loss.item():.4f}")
