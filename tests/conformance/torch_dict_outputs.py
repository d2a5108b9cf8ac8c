"""A model whose forward takes a dict batch and returns a dict (logits, embedding);
the loss combines both; 2 epochs x 4 batches and a no_grad evaluation of 2 batches."""
# expect: {"train": 8, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}, "spans": {"Forward": 10}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Pairs(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 8), torch.randint(0, 3, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, batch):
        emb = torch.relu(self.body(batch["features"]))
        return {"logits": self.head(emb), "embedding": emb}


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
train = DataLoader(Pairs(32), batch_size=8, shuffle=True)
for epoch in range(2):
    for batch in train:
        out = model(batch)
        loss = nn.functional.cross_entropy(out["logits"], batch["label"]) + 1e-3 * out["embedding"].pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
model.eval()
with torch.no_grad():
    val = DataLoader(Pairs(16), batch_size=8)
    correct = sum((model(b)["logits"].argmax(1) == b["label"]).sum().item() for b in val)
print("correct", correct)
