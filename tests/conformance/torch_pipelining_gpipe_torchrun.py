"""Pipeline parallelism (torch.distributed.pipelining) over gloo on the CPU, torchrun with
2 processes: a 2-stage GPipe schedule over 4 microbatches, 6 steps. Every step sends each
microbatch's activation from stage 0 to stage 1 and its gradient back (point-to-point:
24 each way), and the first step exchanges the shapes once (3 each way)."""
# expect: {"launch": "torchrun", "train": 12, "ranks": {"0": {"train": 6}, "1": {"train": 6}},
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "optional": {"train": ["Loss"]},
# expect:  "collectives": {"0": {"send": 27, "recv": 27, "barrier": 1}, "1": {"send": 27, "recv": 27, "barrier": 1}}}
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    part = nn.Sequential(nn.Linear(32, 32), nn.ReLU()) if rank == 0 else nn.Linear(32, 1)
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD(part.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)
    for step in range(6):
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=y, losses=losses)
            if step % 2 == 1:
                print(f"step {step} loss {sum(v.item() for v in losses) / len(losses):.4f}")
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
