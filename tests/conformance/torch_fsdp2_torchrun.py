"""FSDP2 (fully_shard) over gloo on the CPU, torchrun with 2 processes: each Linear is a
shard unit, then the root; 2 epochs x 4 batches per rank. The gathers and reduce-scatters
are FSDP's own torch.distributed calls: per step, each unit gathers before forward and
backward (6) and reduce-scatters after backward (3)."""
# expect: {"launch": "torchrun", "train": 16, "ranks": {"0": {"train": 8}, "1": {"train": 8}},
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_gather": 48, "reduce_scatter": 24, "all_reduce": 2, "barrier": 1},
# expect:                  "1": {"all_gather": 48, "reduce_scatter": 24, "all_reduce": 2, "barrier": 1}}}
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
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
    dist.barrier()
    dist.destroy_process_group()
