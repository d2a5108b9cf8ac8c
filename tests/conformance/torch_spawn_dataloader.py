"""A DataLoader with multiprocessing_context="spawn" and num_workers=2 (workers re-import
the script): 2 epochs x 3 batches of training, 3 validation batches at the end.
The truth names a real problem: without persistent_workers, each epoch spawns two workers that re-import
the script and torch (seconds) before the first batch, against milliseconds of compute: the loop is
input-bound (GetNextBottleneck, with persistent_workers=True to keep them)."""
# expect: {"train": 6, "eval": 3,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "findings": ["GetNextBottleneck"]}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        x = torch.full((8,), float(i) / 24)
        return x, x.pow(2).sum(0, keepdim=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            print(f"val {nn.functional.mse_loss(model(x), y).item():.4f}")
