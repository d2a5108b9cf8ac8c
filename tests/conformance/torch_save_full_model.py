"""torch.save of the whole model object (and of its state_dict and optimizer state)
after training; the files are loaded again in a clean process by the harness."""
# expect: {"train": 10, "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
for i in range(10):
    xb, yb = x[i * 6:(i + 1) * 6], y[i * 6:(i + 1) * 6]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
torch.save(model, "model.pt")
torch.save(model.state_dict(), "weights.pth")
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 10}, "checkpoint.pt")
print(f"loss {loss.item():.4f}")
