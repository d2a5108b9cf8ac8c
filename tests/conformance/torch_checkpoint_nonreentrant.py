"""Activation checkpointing (torch.utils.checkpoint, use_reentrant=False) of two blocks:
the recomputation inside backward is Recompute, never a Forward (8 steps, 8 forwards)."""
# expect: {"train": 8, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 8, "Recompute": 16}}
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32))
        self.block2 = nn.Sequential(nn.ReLU(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        x = checkpoint(self.block1, x, use_reentrant=False)
        x = checkpoint(self.block2, x, use_reentrant=False)
        return self.head(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(64, 8, requires_grad=False), torch.randn(64, 1)), batch_size=8)
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
