"""DataLoader(num_workers=2, persistent_workers=True) for training and validation:
3 epochs x 4 batches, 2 validation batches per epoch."""
# expect: {"train": 12, "eval": 6,
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
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8, shuffle=True,
                       num_workers=2, persistent_workers=True)
    val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8, num_workers=2,
                     persistent_workers=True)
    for epoch in range(3):
        model.train()
        for x, y in train:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.mse_loss(model(x), y).item() for x, y in val) / len(val)
        print(f"epoch {epoch} loss {loss.item():.4f} val {val_loss:.4f}")
