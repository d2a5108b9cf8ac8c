"""A quick validation limited to 3 batches with the usual `if i >= limit: break` at
the top of the loop (the 4th batch is fetched, then left unused): 2 epochs x
(4 train, 3 eval) = 8 train steps and 6 eval steps."""
# expect: {"train": 8, "eval": 6,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "spans": {"Forward": 14}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8)
val = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
LIMIT = 3
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for i, (x, y) in enumerate(val):
            if i >= LIMIT:
                break
            correct += (model(x).argmax(1) == y).sum().item()
    print(f"epoch {epoch} loss {loss.item():.4f} correct {correct}")
