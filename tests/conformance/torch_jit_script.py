"""torch.jit.script of a trained model with control flow; the ScriptModule is saved
and its code printed."""
# expect: {"train": 8, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 8}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if h.sum() > 0:
            h = h * 1.5
        return self.fc2(h)


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=8)
for x, y in data:
    opt.zero_grad()
    loss = model.loss(model(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
scripted = torch.jit.script(model)
scripted.save("scripted.pt")
print(scripted.code.strip())
