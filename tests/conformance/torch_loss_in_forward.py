"""The Hugging Face style: forward(x, labels) computes the loss itself and returns an
output object with .loss and .logits; 8 steps, then 2 evaluation batches."""
# expect: {"train": 8, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"train": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}, "spans": {"Forward": 10}}
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


@dataclass
class Output:
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, input_ids, labels=None):
        logits = self.net(input_ids)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return Output(logits=logits, loss=loss)


model = Classifier()
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=8)
model.train()
for x, y in data:
    outputs = model(x, labels=y)
    outputs.loss.backward()
    opt.step()
    opt.zero_grad()
print(f"loss {outputs.loss.item():.4f}")
model.eval()
with torch.no_grad():
    for x, y in DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 3, (16,))), batch_size=8):
        print("predicted", model(x).logits.argmax(-1).tolist())
