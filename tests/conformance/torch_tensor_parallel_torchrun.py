"""Tensor parallelism (DTensor) over gloo on the CPU, torchrun with 2 processes: an MLP
whose first Linear is column-parallel and second row-parallel (parallelize_module), 2
epochs x 4 batches, the same batches on both ranks. The row-parallel output is
all-reduced in every forward, a functional collective (8); parallelize_module's set-up
scatters the weights (3) and broadcasts the replicated bias (1); the epoch's loss is
all-reduced with torch.distributed (2)."""
# expect: {"launch": "torchrun", "train": 16, "ranks": {"0": {"train": 8}, "1": {"train": 8}},
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_reduce": 10, "scatter": 3, "broadcast": 1, "barrier": 1},
# expect:                  "1": {"all_reduce": 10, "scatter": 3, "broadcast": 1, "barrier": 1}}}
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)  # the same batches on every rank
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]
    for epoch in range(2):
        for x, y in batches:
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
