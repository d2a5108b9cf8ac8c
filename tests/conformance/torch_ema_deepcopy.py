"""An exponential moving average of the weights, kept by copy.deepcopy of the model,
refreshed with a fresh deepcopy every 4 steps; the EMA model is evaluated at the end."""
# expect: {"train": 12, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}}
import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
ema = copy.deepcopy(model).eval()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 1)), batch_size=4)
for i, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if i % 4 == 3:
        ema = copy.deepcopy(model).eval()  # a fresh copy now and then
    else:
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.mul_(0.9).add_(pm, alpha=0.1)
print(f"loss {loss.item():.4f}")
with torch.no_grad():
    val = DataLoader(TensorDataset(torch.randn(8, 8), torch.randn(8, 1)), batch_size=4)
    for x, y in val:
        print(f"ema val {nn.functional.mse_loss(ema(x), y).item():.4f}")
