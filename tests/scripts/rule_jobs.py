"""Unmodified training jobs that provoke (or do not provoke) each rule: python rule_jobs.py KIND."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowDataset(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 512), torch.randn(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.0005)  # decoding an image from a slow disk
        return self.x[i], self.y[i]


def model(hidden=512):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


def train(loader, steps_hook=None, keep=None, hidden=512):
    m = model(hidden)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        out = m(x)
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        if keep is not None:
            keep.append(out.detach().repeat(1, 12000))  # ~6 MB per step, never released
        if steps_hook:
            steps_hook(i)


def main(kind):
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(128 * 60, 512), torch.randn(128 * 60, 1))
    if kind == "clean":
        train(DataLoader(data, batch_size=128))
    elif kind == "slowdata":
        train(DataLoader(SlowDataset(32 * 40), batch_size=32), hidden=2048)
    elif kind == "slowdata8":  # the same job after raising num_workers
        train(DataLoader(SlowDataset(32 * 40), batch_size=32, num_workers=8), hidden=2048)
    elif kind == "stall":
        train(DataLoader(data, batch_size=128), steps_hook=lambda i: time.sleep(0.2) if i % 15 == 7 else None)
    elif kind == "onehiccup":  # one slow step in 120 (a scheduler hiccup, a one-off log flush): no finding
        big = TensorDataset(torch.randn(128 * 120, 512), torch.randn(128 * 120, 1))
        train(DataLoader(big, batch_size=128), steps_hook=lambda i: time.sleep(0.3) if i == 60 else None)
    elif kind == "stall40":  # a 40 ms stall every 40 steps (periodic work): a finding
        big = TensorDataset(torch.randn(64 * 240, 512), torch.randn(64 * 240, 1))
        train(DataLoader(big, batch_size=64), steps_hook=lambda i: time.sleep(0.04) if i % 40 == 25 else None)
    elif kind == "slowtenth":  # a tenth of the steps, at no regular place, 3x slower: a finding
        import random
        slow = set(random.Random(0).sample(range(5, 200), 20))
        big = TensorDataset(torch.randn(32 * 200, 512), torch.randn(32 * 200, 1))
        train(DataLoader(big, batch_size=32), steps_hook=lambda i: time.sleep(0.09 if i in slow else 0.03))
    elif kind == "evalpasses":  # 4 epochs, each with a validation pass; the first pass warms up slowly
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        val = DataLoader(TensorDataset(torch.randn(64 * 12, 512), torch.randn(64 * 12, 1)), batch_size=64)
        for epoch in range(4):
            m.train()
            for x, y in DataLoader(data, batch_size=256):
                opt.zero_grad()
                nn.functional.mse_loss(m(x), y).backward()
                opt.step()
            m.eval()
            with torch.no_grad():
                for x, y in val:
                    m(x)
                    time.sleep(0.003 if epoch else 0.08)  # the first pass: caches, a new iterator, traces
    elif kind.startswith("epochworkers"):  # workers started again at every epoch, each opening its data
        hidden = 2048 if kind == "epochworkers" else 128
        loader = DataLoader(TensorDataset(torch.randn(64 * 40, 512), torch.randn(64 * 40, 1)), batch_size=64,
                            num_workers=2, worker_init_fn=lambda worker: time.sleep(0.1))
        m = model(hidden)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                nn.functional.mse_loss(m(x), y).backward()
                opt.step()
    elif kind == "leak":
        kept = []
        # paced so that the steady state lasts over HostMemoryIncrease's min_window_s (5 s)
        train(DataLoader(TensorDataset(torch.randn(128 * 100, 512), torch.randn(128 * 100, 1)), batch_size=128),
              keep=kept, steps_hook=lambda i: time.sleep(0.06))
    elif kind == "slowinit":
        time.sleep(6)  # downloading a dataset
        train(DataLoader(data, batch_size=128))
    elif kind == "straggler":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        x, y = torch.randn(128, 512), torch.randn(128, 1)
        for i in range(30):
            if dist.get_rank() == 1:
                time.sleep(0.015)  # extra work on one rank only
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        dist.destroy_process_group()
    print("done", kind)


if __name__ == "__main__":
    main(sys.argv[1])
