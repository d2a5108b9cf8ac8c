"""DistributedDataParallel over gloo, started by torchrun with 2 processes
(DistributedSampler, 2 epochs x 4 batches per rank); rank 0 saves the weights. Collectives:
DDP's parameter broadcast, one 644-byte bucket a step, a loss all-reduce per epoch, a barrier."""
# expect: {"launch": "torchrun", "train": 16, "ranks": {"0": {"train": 8}, "1": {"train": 8}},
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_reduce": [10, 5160], "broadcast": [1, 644], "barrier": [1, 0]},
# expect:                  "1": {"all_reduce": [10, 5160], "broadcast": [1, 644], "barrier": [1, 0]}}}
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} mean loss {total.item() / dist.get_world_size():.4f}")
    if rank == 0:
        torch.save(model.module.state_dict(), "ddp.pth")
    dist.barrier()
    dist.destroy_process_group()
