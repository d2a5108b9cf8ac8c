"""Each iteration also runs over a small reference set's loader of its own before its
backward (a regulariser's data, as in continual learning's replay of anchors): one train
step an iteration, the reference fetches its GetNext; 8 iterations, 8 train steps."""
# expect: {"train": 8,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
anchors = TensorDataset(torch.randn(24, 16))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
steps = 0
for x, y in DataLoader(data, batch_size=8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    for (a,) in DataLoader(anchors, batch_size=8):
        loss = loss + 1e-3 * model(a).pow(2).mean()
    loss.backward()
    opt.step()
    steps += 1
print(f"optimizer steps {steps} loss {loss.item():.4f}")
