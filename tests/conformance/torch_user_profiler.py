"""The job runs its own torch.profiler.profile (schedule wait 1, warmup 1, active 2)
and exports a Chrome trace: the trace is still written, with the same ops and steps."""
# expect: {"train": 6, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import json

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 1)), batch_size=8)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=lambda p: p.export_chrome_trace("trace.json")) as prof:
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        prof.step()
print(f"loss {loss.item():.4f}")
with open("trace.json") as f:
    events = json.load(f)["traceEvents"]
names = {e.get("name", "") for e in events}
print("profiler steps", sorted(n for n in names if n.startswith("ProfilerStep#")))
print("ops", sorted(n for n in names if n in ("aten::addmm", "aten::mse_loss", "aten::relu", "Optimizer.step#SGD.step",
                                              "autograd::engine::evaluate_function: AddmmBackward0")))
