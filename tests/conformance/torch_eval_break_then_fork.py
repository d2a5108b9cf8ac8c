"""An evaluation loop over a num_workers=2 loader left with `break` after 4 batches,
then a fresh iterator (new forked workers) the next epoch: 3 epochs x 4 eval batches
= 12 eval steps, 3 x 4 train batches = 12 train steps."""
# expect: {"train": 12, "eval": 12,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, num_workers=2)
    for epoch in range(3):
        model.train()
        for x, y in train:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for i, (x, y) in enumerate(val):
                total += nn.functional.mse_loss(model(x), y).item()
                if i == 3:
                    break  # a quick validation: the iterator and its workers are left behind
        print(f"epoch {epoch} loss {loss.item():.4f} val {total / 4:.4f}")
