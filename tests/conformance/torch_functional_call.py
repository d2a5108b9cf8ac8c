"""torch.func.functional_call with the module's own parameters (and a perturbed copy
for a sharpness-aware style second pass without an optimizer step)."""
# expect: {"train": 8, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
for x, y in data:
    params = dict(model.named_parameters())
    opt.zero_grad()
    loss = nn.functional.mse_loss(functional_call(model, params, (x,)), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
