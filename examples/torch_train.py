"""An ordinary PyTorch training script, with nothing of stepscope in it.

    stepscope run -- python3 examples/torch_train.py [--workers N] [--epochs N]
    STEPSCOPE=1 python3 examples/torch_train.py            # the same, without the launcher

A small convolutional network on synthetic 32x32 images. The dataset spends a
millisecond or two "decoding" each sample, so with the default `--workers 0`
the loop waits for data and stepscope's verdict says so (GetNextBottleneck);
run it again with `--workers 4` and compare with `stepscope diff RUN_A RUN_B`.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    """Synthetic labelled images that take time to produce, like JPEG decoding does."""

    def __init__(self, n=1024, decode_s=0.0015):
        self.n, self.decode_s = n, decode_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.decode_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    train = DataLoader(SlowImages(), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    val = DataLoader(SlowImages(512, decode_s=0), batch_size=256, num_workers=0)
    for epoch in range(args.epochs):
        net.train()
        for x, y in train:
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            correct = sum((net(x).argmax(1) == y).sum().item() for x, y in val)
        print(f"epoch {epoch}: loss {loss.item():.3f}, val accuracy {correct / 512:.2%}")


if __name__ == "__main__":
    main()
