"""DDP jobs whose communication is known, for tests/test_communication.py (torchrun, 2 ranks):

    straggler  rank 1 sleeps DELAY_S in every forward: rank 0 waits for it in the all-reduce (16 steps)
    exposed    one large bucket (bucket_cap_mb=1000): its all-reduce starts when backward is done
               (30 steps)
    healthy    a small model whose layers also wait, as on a GPU (2 ms a layer forward, 5 ms
               backward: the host is free meanwhile): the all-reduce hides behind backward.
               (With CPU compute alone, two ranks keep two cores busy: gloo's threads get no
               core until backward ends, and any hiccup of one rank is the other's wait.)
    own_hook   the program registers its own comm hook (counting buckets) before training
    late_hook  ...after the first step (it then runs inside stepscope's)
    cycles     stepscope started and stopped twice around training the same model (its own
               API, no STEPSCOPE=1), then the program registers a hook with stepscope off
    setupskew  rank 1 sets up 1 s longer (loads a checkpoint), both meet at a broadcast, then
               20 balanced steps: the wait is set-up, no straggler
    balanced   20 balanced steps of a mid-sized model (the test runs it beside busy cores)
    straggler9 the straggler, 9 steps: too few to judge
    fsdp       FSDP2 (fully_shard per Linear, then the root), rank 1 doing DELAY_S more host work
               before each forward, 16 steps: it is late at each step's first gather only, and
               at the step's other collectives the order is a coin flip (issue 75 item 1)
    closure    the exposed job's model stepped with a closure (Lightning's way): backward,
               and its all-reduce, run inside optimizer.step()

Prints the buckets the program's hook counted (own_hook, late_hook) as ``buckets <n>``."""

import gc
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

DELAY_S = 0.03
STEPS = 12
# The exposed job is judged by CommunicationBound, which wants 0.2 s of train steps a rank after
# its warm-up: 12 steps of ~25 ms left 0.21 s here, and a faster machine fell under it. The
# straggler is judged per step, from 8 steps after the warm-up and without the 4 of stepscope's
# operator window (train steps 5-8)
STEPS_OF = {"setupskew": 20, "balanced": 20, "exposed": 30, "straggler": 16, "straggler9": 9, "fsdp": 16}


class Slow(nn.Module):
    def __init__(self, inner, delay):
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.inner(x)


class DeviceTime(torch.autograd.Function):
    """An identity that waits, forward and backward, as a GPU kernel keeps the device busy:
    the host's core is left to DDP's all-reduce of the buckets already ready."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(0.002)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.005)
        return grad


class Device(nn.Module):
    def forward(self, x):
        return DeviceTime.apply(x)


def main(job):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if job == "healthy":  # buckets of about one layer each: all but the first layer's overlap backward
        width, batch = 256, 64
        inner = nn.Sequential(*[nn.Sequential(Device(), nn.Linear(256, 256), nn.Tanh()) for _ in range(6)],
                              nn.Linear(256, 1))
    elif job in ("exposed", "closure"):
        width, batch = 768, 16
        inner = nn.Sequential(*[nn.Sequential(nn.Linear(768, 768), nn.ReLU()) for _ in range(4)], nn.Linear(768, 1))
    else:
        width, batch = 64, 32
        inner = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    if job in ("setupskew", "balanced"):
        width, batch = 128, 256
        inner = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    delay = DELAY_S if job in ("straggler", "straggler9", "fsdp") and rank == 1 else 0.0
    caps = {"exposed": 1000, "closure": 1000, "healthy": 0.3}  # MB: one bucket, or one per layer
    if job == "fsdp":
        from torch.distributed.fsdp import fully_shard

        width, batch = 64, 32
        inner = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        for layer in inner:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model = Slow(inner, delay)
        fully_shard(model)
    else:
        model = DDP(module=Slow(inner, delay), bucket_cap_mb=caps.get(job, 25))
    counted = [0]

    def counting(state, bucket):
        counted[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    if job == "own_hook":
        model.register_comm_hook(None, counting)
    if job == "cycles":
        import tempfile

        import stepscope
        from stepscope.integrations import torch as st_torch

        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for cycle in range(2):
            st_torch.instrument()
            with stepscope.profile(dir=tempfile.mkdtemp(), name=f"cycle{cycle}"):
                for _ in range(3):
                    opt.zero_grad()
                    nn.functional.mse_loss(model(torch.randn(batch, width)), torch.randn(batch, 1)).backward()
                    opt.step()
            st_torch.uninstrument()
        model.register_comm_hook(None, counting)
    if job == "setupskew":
        if rank == 1:
            time.sleep(1.0)  # loading and sharding a checkpoint
        dist.broadcast(torch.zeros(1000), src=0)  # the others wait for it here, before training
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS_OF.get(job, STEPS)):
        x, y = torch.randn(batch, width), torch.randn(batch, 1)
        if job == "closure":
            def closure():
                opt.zero_grad()
                out = nn.functional.mse_loss(model(x), y)
                out.backward()
                return out

            loss = opt.step(closure)
            continue
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if job == "late_hook" and step == 0:
            model.register_comm_hook(None, counting)
    if job in ("own_hook", "late_hook", "cycles"):
        print(f"rank {rank} buckets {counted[0]}")
    if rank == 0:
        print(f"loss {loss.item():.4f}")
    dist.barrier()
    # The model (its Reducer, the comm hook's futures) goes before the process group: freed in
    # the interpreter's finalization instead, gloo's threads can abort the process (SIGABRT).
    model = opt = None
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
