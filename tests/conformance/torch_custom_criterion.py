"""A criterion written as a plain nn.Module, as timm's LabelSmoothingCrossEntropy
and the FocalLoss of many repositories are (not a torch.nn loss class), with
zero_grad between the loss and the backward; validation uses it too. Its forward
is the Loss of each step, not a second Forward. 2 epochs x 6 batches, 6
validation batches each."""
# expect: {"train": 12, "eval": 12,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward", "Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["Forward", "Loss"]},
# expect:  "spans": {"Forward": 24, "Loss": 24}}
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class LabelSmoothingCrossEntropy(nn.Module):
    def __init__(self, smoothing=0.1):
        super().__init__()
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing

    def forward(self, x, target):
        logprobs = F.log_softmax(x, dim=-1)
        nll = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        return (self.confidence * nll + self.smoothing * -logprobs.mean(dim=-1)).mean()


torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
criterion = LabelSmoothingCrossEntropy()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(96, 16), torch.randint(0, 10, (96,))), batch_size=16)
for epoch in range(2):
    model.train()
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val = sum(criterion(model(x), y).item() for x, y in loader) / len(loader)
    print(epoch, f"loss {loss.item():.4f}", f"val {val:.4f}")
