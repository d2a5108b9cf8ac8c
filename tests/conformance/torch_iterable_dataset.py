"""An IterableDataset that shards its stream by worker (num_workers=2): 2 epochs of
6 batches each.
The truth names a real problem: each epoch starts its two workers again (tens of ms before the first
batch, and the second worker's first batch) against ~3 ms steps: input-bound (GetNextBottleneck, with
persistent_workers=True to keep them)."""
# expect: {"train": 12, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]},
# expect:  "findings": ["GetNextBottleneck"]}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, len(self.x), step):
            yield self.x[i], self.y[i]


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Stream(24), batch_size=4, num_workers=2)
    for epoch in range(2):
        n = 0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            n += 1
        print(f"epoch {epoch} batches {n} loss {loss.item():.4f}")
