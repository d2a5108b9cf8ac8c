"""Evaluation under torch.inference_mode() after each epoch, and a last evaluation with
model.eval() but gradients left enabled (metrics computed without no_grad):
2 epochs x 4 train batches, 2 + 2 inference batches, then 2 more eval batches."""
# expect: {"train": 8, "eval": 6,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "spans": {"Forward": 14}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))), batch_size=8, shuffle=True)
val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 3, (16,))), batch_size=8)
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val)
    print(f"epoch {epoch} loss {loss.item():.4f} correct {correct}")
model.eval()
scores = [model(x).softmax(1).max(1).values.mean().item() for x, _ in val]  # gradients on, no backward
print("confidence", [round(s, 4) for s in scores])
