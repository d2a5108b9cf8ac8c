"""torch.jit.trace of a trained model (tracing runs the model once: not an eval batch);
the traced module is saved and its code printed."""
# expect: {"train": 8, "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 8}}
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
for i in range(8):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8])
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
traced = torch.jit.trace(model.eval(), torch.randn(2, 8))
traced.save("traced.pt")
print(traced.code.strip())
