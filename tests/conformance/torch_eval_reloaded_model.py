"""Train, save the model, load it back and run it on a held-out tensor (no DataLoader):
the reloaded model's two inference calls are eval steps."""
# expect: {"train": 10, "eval": 2,
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "every": {"train": ["Forward"], "eval": ["Forward"]}}
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(60, 8), torch.randint(0, 2, (60,))
for i in range(10):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x[i * 6:(i + 1) * 6]), y[i * 6:(i + 1) * 6])
    loss.backward()
    opt.step()
torch.save(model, "model.pt")
best = torch.load("model.pt", weights_only=False).eval()
with torch.no_grad():
    for part in torch.randn(16, 8).split(8):
        print(f"prediction {best(part).argmax(1).tolist()}")
print(f"loss {loss.item():.4f}")
