"""An unmodified PyTorch job over several epochs of a DataLoader whose workers
start again every epoch: python epochs.py [EPOCHS] [persistent|plain] [WORKERS] [WORK_MS]

WORK_MS: host work in each step besides the model (logging, metrics), in ms."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    """Decoding takes 2 ms a sample: a batch of 16 takes a worker 32 ms."""

    def __init__(self, n):
        self.x, self.y = torch.randn(n, 64), torch.randn(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.002)
        return self.x[i], self.y[i]


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    persistent = len(sys.argv) > 2 and sys.argv[2] == "persistent"
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    work_s = float(sys.argv[4]) / 1e3 if len(sys.argv) > 4 else 0.0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(SlowDataset(16 * 10), batch_size=16, num_workers=workers,
                        persistent_workers=persistent and workers > 0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            time.sleep(work_s)
    print("done", epochs)


if __name__ == "__main__":
    main()
