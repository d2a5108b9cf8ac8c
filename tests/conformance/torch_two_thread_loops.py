"""Two models trained at once, each in its own thread (a ThreadPoolExecutor
running a small hyper-parameter sweep): two loops, two sequences of steps,
each phased on its own (SPEC §3)."""
# expect: {"train": 48,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 48, "Optimizer": 48}}
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def train(lr: float) -> float:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    data = TensorDataset(torch.randn(96, 16, generator=g), torch.randn(96, 1, generator=g))
    for _ in range(3):
        for x, y in DataLoader(data, batch_size=12):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    return loss.item()


with ThreadPoolExecutor(max_workers=2) as pool:
    losses = list(pool.map(train, [0.01, 0.05]))
print("losses", [round(v, 4) for v in losses])
