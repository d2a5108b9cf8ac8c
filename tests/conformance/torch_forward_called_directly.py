"""model.forward(x) called directly instead of model(x) (the submodules are still
called through __call__): one model forward per step, 8 steps."""
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
        self.encoder = nn.Linear(8, 16)
        self.decoder = nn.Linear(16, 1)

    def forward(self, x):
        return self.decoder(torch.relu(self.encoder(x)))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model.forward(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")
