"""DistributedDataParallel compiled with torch.compile (aot_eager: no C compiler needed),
torchrun with 2 processes, 6 steps per rank; dynamo's DDPOptimizer splits the graph at the
bucket boundaries. Its buckets are recorded: stepscope's comm hook goes on when the model
is built, outside the compiled frame."""
# expect: {"launch": "torchrun", "train": 12, "ranks": {"0": {"train": 6}, "1": {"train": 6}},
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "collectives": {"0": {"all_reduce": [7, 3868], "broadcast": [1, 644], "barrier": [1, 0]},
# expect:                  "1": {"all_reduce": [7, 3868], "broadcast": [1, 644], "barrier": [1, 0]}},
# expect:  "ddp_buckets": {"0": 6, "1": 6},
# expect:  "same_lines": "^\\[rank\\d\\]:W\\d+ [\\d:.]+ \\d+ (.*)$"}
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.compile(DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for step in range(6):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    if rank == 0:
        print(f"loss {total.item() / 2:.4f}")
        print(f"weights {sum(p.detach().sum().item() for p in model.parameters()):.4f}")
    dist.barrier()
    dist.destroy_process_group()
