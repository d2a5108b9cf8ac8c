"""DistributedDataParallel over gloo with 2 processes started by
torch.multiprocessing.spawn (3 epochs x 2 batches per rank)."""
# expect: {"train": 12, "ranks": {"0": {"train": 6}, "1": {"train": 6}},
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_reduce": [7, 3868], "broadcast": [1, 644], "barrier": [1, 0]},
# expect:                  "1": {"all_reduce": [7, 3868], "broadcast": [1, 644], "barrier": [1, 0]}}}
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    if rank == 0:
        print(f"mean loss {total.item() / world_size:.4f}")
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)
    print("done")
