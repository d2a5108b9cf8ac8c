"""The training loop runs in a worker thread (a GUI or a server keeps the main
thread); the main thread waits for it."""
# expect: {"train": 8, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import threading

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
result = {}


def train_job():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    result["loss"] = loss.item()
    model.eval()
    with torch.no_grad():
        val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
        result["val"] = [model(x).mean().item() for x, _ in val]


t = threading.Thread(target=train_job, name="trainer")
t.start()
t.join()
print(f"loss {result['loss']:.4f} val {[round(v, 4) for v in result['val']]}")
