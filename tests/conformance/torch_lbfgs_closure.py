"""LBFGS with a closure (forward and backward run inside optimizer.step, several times
per step): 6 train steps, each counted once."""
# expect: {"train": 6, "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}, "spans": {"Optimizer": 6}}
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
x, y = torch.randn(32, 4), torch.randn(32, 1)
loss_fn = nn.MSELoss()


def closure():
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss


for i in range(6):
    loss = opt.step(closure)
print(f"loss {loss.item():.4f}")
