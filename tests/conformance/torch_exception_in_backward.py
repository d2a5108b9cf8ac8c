"""A job whose 6th backward raises (a custom autograd function's backward fails, as a
shape bug in a hand-written backward does): the exception ends the job with exit code 1.
5 optimizer steps ran: 5 train steps; the 6th iteration, which never reached its
optimizer step, stays on the timeline as an interrupted step."""
# expect: {"exit": 1, "train": 5, "interrupted": 1,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class ScaledGrad(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        ScaledGrad.calls += 1
        if ScaledGrad.calls == 6:
            raise RuntimeError(f"hand-written backward failed on call {ScaledGrad.calls}")
        return grad


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = DataLoader(TensorDataset(torch.randn(96, 8), torch.randn(96, 1)), batch_size=8)
for step, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = nn.functional.mse_loss(ScaledGrad.apply(model(x)), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
