"""One rank of a two-"node" gloo job, each node writing its own run folder.

usage: multinode.py RANK WORLD PORT DIR HOST SKEW_S MARK_FILE

A node is simulated by its host name and a wall clock SKEW_S seconds off
(``time.time_ns`` shifted before stepscope reads its anchor), as on a host
whose NTP is wrong. MARK_FILE receives the monotonic time at which the rank
opened its ``mark`` annotation: the truth the merge's alignment is checked
against (both "nodes" really share one CLOCK_MONOTONIC).
"""
import json
import os
import socket
import sys
import time

rank, world, port, out_dir, host, skew_s, mark_file = sys.argv[1:8]
rank, world, port, skew_ns = int(rank), int(world), int(port), int(float(skew_s) * 1e9)
socket.gethostname = lambda: host
_real_time_ns = time.time_ns
time.time_ns = lambda: _real_time_ns() + skew_ns

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import stepscope  # noqa: E402
import stepscope.integrations.torch as st_torch  # noqa: E402

run = stepscope.start(dir=out_dir, name="multinode")
st_torch.instrument()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 8), torch.randn(8, 1)
for _ in range(4):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
mono = time.monotonic_ns()
with stepscope.annotate("mark"):
    pass
with open(mark_file, "w") as f:
    json.dump({"rank": rank, "mono_ns": mono}, f)
clock = os.path.join(run.process_dir, "clock.json")
deadline = time.monotonic() + 20
while not os.path.exists(clock) and time.monotonic() < deadline:  # the exchange runs beside training
    time.sleep(0.05)
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()
run.stop()
