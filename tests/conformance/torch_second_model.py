"""Two models trained one after the other in one script (a small baseline, then the
real model, with a new optimizer, long after the first model's steps): every step
of both has its Forward."""
# expect: {"train": 16, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 16}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)


def fit(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return loss.item()


print(f"baseline {fit(nn.Linear(8, 1)):.4f}")
print(f"mlp {fit(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))):.4f}")
