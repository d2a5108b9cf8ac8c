"""Mixed precision with torch.amp.GradScaler (as in PyTorch's AMP recipe), on the CPU:
10 batches, and on 2 of them the gradients overflow (a loss made inf on purpose, as
fp16 overflows while the scale settles), so the scaler skips optimizer.step(). Those
iterations are steps all the same: 10 steps, 10 Optimizer spans (2 of them the
scaler's own time)."""
# expect: {"train": 10, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Optimizer": 10}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
data = DataLoader(TensorDataset(torch.randn(160, 16), torch.randint(0, 4, (160,))), batch_size=16)
for i, (x, y) in enumerate(data):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    if i in (2, 5):
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    print(i, scaler.get_scale())
torch.save(model.state_dict(), "amp.pt")
