"""A DataLoader training loop with a no_grad validation pass inside each epoch.

2 epochs x 4 batches of training, 2 validation batches after each epoch.
"""
# expect: {"train": 8, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(TensorDataset(torch.randn(32, 16), torch.randn(32, 1)), batch_size=8, shuffle=True)
val = DataLoader(TensorDataset(torch.randn(16, 16), torch.randn(16, 1)), batch_size=8)
loss_fn = nn.MSELoss()
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in val:
            total += loss_fn(model(x), y).item()
    print(f"epoch {epoch} train {loss.item():.4f} val {total / len(val):.4f}")
