"""A training loop whose 7th batch raises after its fetch (a corrupt record); the program
catches the error outside the loop, logs it and runs its evaluation. 6 optimizer steps ran:
6 train steps; the 7th iteration is an interrupted step that ends where the evaluation's
first fetch begins; the 4 eval batches are eval steps of their own."""
# expect: {"train": 6, "interrupted": 1, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 16), torch.randn(128, 1))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
done = 0
try:
    for i, (x, y) in enumerate(DataLoader(data, batch_size=16)):
        opt.zero_grad()
        if i == 6:
            raise ValueError(f"corrupt record in batch {i}")
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        done += 1
except ValueError as e:
    print("skipped the rest of the epoch:", e)
model.eval()
with torch.no_grad():
    total = sum(nn.functional.mse_loss(model(x), y).item() for x, y in DataLoader(data, batch_size=32))
print(f"optimizer steps {done} eval loss {total / 4:.4f}")
