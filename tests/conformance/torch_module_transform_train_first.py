"""A map-style Dataset applying an nn.Module transform (Normalize-like, with buffers)
in __getitem__, num_workers=0: the transform is part of GetNext, never a Forward.
Train first: 2 epochs of (4 train batches, then 2 eval batches)."""
# expect: {"train": 8, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "spans": {"Forward": 12}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

    def forward(self, x):
        return (x - self.mean) / self.std


class Images(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 3, 4, 4, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.transform = nn.Sequential(Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.transform(self.x[i]), self.y[i]


torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(Images(32, 1), batch_size=8, shuffle=True)
val = DataLoader(Images(16, 2), batch_size=8)


def evaluate():
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val)
    model.train()
    return correct



for epoch in range(2):
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f} correct {evaluate()}")
