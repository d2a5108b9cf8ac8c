"""Distributed jobs whose traffic is not DDP's, for tests/test_traffic.py (torchrun, 2 ranks,
gloo). Each prints its truth, counted by the job itself (wrappers of its own around the
process group's send and recv and the functional all_reduce), as ``truth <json>``.

    tp        tensor parallelism: a Colwise/Rowwise-parallel MLP (parallelize_module), 10
              steps: the Rowwise layer's output is all-reduced in every forward (a
              functional collective), its input's gradient in every backward
    fsdpclip  FSDP2 (fully_shard) with clip_grad_norm_, 8 steps: the norm's all-reduce
              (a functional collective, through DTensor) beside the gathers and reduce-scatters
    pipeline  torch.distributed.pipelining, a 2-stage GPipe schedule over 4 microbatches, 24
              steps (18 judged: the warm-up and the operator window left out); stage 1 has 6
              layers to stage 0's one: stage 0 waits for it (the bubble)
    p2p       send/recv and isend/irecv/batch_isend_irecv ping-pong, 12 rounds; rank 1
              sleeps 20 ms before it answers: rank 0 waits for it in recv
    compiled  a torch.compile'd function (aot_eager) that all-reduces with a functional
              collective, in each of 12 steps: the collective runs inside the compiled graph,
              where nothing is recorded (the summary says so)
"""

import collections
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn

STEPS = 10
TRUTH = collections.Counter()  # what the job's calls reached, counted by wrappers of its own


def count_truth():
    """Wrappers that count every point-to-point call (per channel ``kind src>dst``) and every
    functional all-reduce, around whatever is there (stepscope's wrappers, when profiled)."""
    pg = dist.ProcessGroup

    def p2p(kind, original):
        def counted(group, tensors, peer, *args, **kwargs):
            own, other = dist.get_rank(), dist.get_global_rank(group, peer)
            TRUTH[f"{kind} {own}>{other}" if kind == "send" else f"{kind} {other}>{own}"] += 1
            return original(group, tensors, peer, *args, **kwargs)
        return counted

    for kind in ("send", "recv"):  # (what the class holds: a C wrapper read through the class gives its original)
        setattr(pg, kind, p2p(kind, pg.__dict__[kind]))
    original = funcol.all_reduce

    def all_reduce(*args, **kwargs):
        if not torch.compiler.is_compiling():  # (what a compiled graph runs is no call of the job's)
            TRUTH["functional all_reduce"] += 1
        return original(*args, **kwargs)

    funcol.all_reduce = all_reduce


def tp(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,))
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for _ in range(STEPS):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return {"forwards": STEPS}


def fsdpclip(rank):
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    steps = 8
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return {"clips": steps}


def pipeline(rank):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    width, micro = 256, 4
    if rank == 0:
        part = nn.Sequential(nn.Linear(width, width), nn.ReLU())
    else:  # the heavier stage
        part = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(6)])
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=nn.MSELoss())  # (every stage: backward on)
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    x, y = torch.randn(64, width), torch.randn(64, width)
    steps = 24
    for _ in range(steps):
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()
    # per step, each microbatch's activation goes 0 -> 1 and its gradient 1 -> 0
    return {"steps": steps, "micro": micro}


def p2p(rank):
    peer = 1 - rank
    buf = torch.zeros(1024)
    rounds = 12
    for i in range(rounds):
        if rank == 0:
            dist.send(torch.full((1024,), float(i)), peer)
            dist.recv(buf, peer)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, buf, peer)])
            for r in reqs:
                r.wait()
        else:
            dist.recv(buf, peer)
            time.sleep(0.02)
            dist.send(buf, peer)
            dist.irecv(buf, peer).wait()
            dist.isend(buf, peer).wait()
    return {"rounds": rounds}


def compiled(rank):
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="aot_eager")
    def averaged(t):
        return funcol.all_reduce(t, "sum", dist.group.WORLD) / 2

    x = torch.randn(16, 64)
    steps = 12
    for _ in range(steps):
        opt.zero_grad()
        y = model(x)
        (y.pow(2).mean() + 0 * averaged(y.detach()).sum()).backward()
        opt.step()
    return {"steps": steps}


def main(job):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    count_truth()
    truth = {"tp": tp, "fsdpclip": fsdpclip, "pipeline": pipeline, "p2p": p2p, "compiled": compiled}[job](rank)
    truth.update(TRUTH, rank=rank)
    dist.barrier()
    os.write(1, f"truth {json.dumps(truth)}\n".encode())  # (one write: the two ranks' lines stay whole)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
