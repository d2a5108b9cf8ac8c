"""Full-batch training: one next(iter(loader)) for the whole data set, then 30
optimizer steps on it (30 train steps; only the first fetches)."""
# expect: {"train": 30, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 30, "GetNext": 1}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=40)
x, y = next(iter(loader))
for i in range(30):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
