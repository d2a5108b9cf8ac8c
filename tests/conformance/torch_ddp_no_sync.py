"""DistributedDataParallel with gradient accumulation: 4 micro-batches an optimizer step,
the first 3 under model.no_sync() (no all-reduce), torchrun with 2 processes, 2 epochs x 8
micro-batches per rank: 4 optimizer steps and 4 bucket all-reduces per rank."""
# expect: {"launch": "torchrun", "train": 8, "ranks": {"0": {"train": 4}, "1": {"train": 4}},
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_reduce": [4, 2576], "broadcast": [1, 644], "barrier": [1, 0]},
# expect:                  "1": {"all_reduce": [4, 2576], "broadcast": [1, 644], "barrier": [1, 0]}}}
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUMULATE = 4

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % ACCUMULATE == 0
            with contextlib.nullcontext() if last else model.no_sync():
                loss = nn.functional.mse_loss(model(x), y) / ACCUMULATE
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * ACCUMULATE:.4f}")
    if rank == 0:
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        print(f"weights {w.sum().item():.4f}")
    dist.barrier()
    dist.destroy_process_group()
