"""Phases marked by hand with torch.profiler.record_function, profiled by
torch.profiler; stepscope (STEPSCOPE=1) profiles the same run. Prints torch's
per-phase totals in microseconds as JSON, with the measured cost of an empty
record_function range (torch's own share of each range, measured here, on the machine that runs it)."""
import json
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
ds = TensorDataset(torch.randn(64 * 40, 256), torch.randn(64 * 40, 1))
loader = DataLoader(ds, batch_size=64)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())], nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
crit = nn.MSELoss()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    it = iter(loader)
    steps = 0
    for _ in range(len(loader)):  # no exhausted fetch inside a GetNext range
        with record_function("GetNext"):
            xb, yb = next(it)
        with record_function("Forward"):
            out = model(xb)
        with record_function("Loss"):
            loss = crit(out, yb)
        with record_function("Backward"):
            loss.backward()
        with record_function("Optimizer"):
            opt.step()
        opt.zero_grad()
        # torch's own cost inside each hand-placed range, measured on this machine: an empty
        # range's length (what any range holds of itself), and a range holding one empty range
        # (what a range nested in it costs the outer one, whole: optimizer.step() opens one).
        with record_function("Empty"):
            pass
        with record_function("Holder"):
            with record_function("Held"):
                pass
        steps += 1
averages = {e.key: e for e in prof.key_averages()}
def mean_us(key):
    return averages[key].cpu_time_total / averages[key].count


empty_us = mean_us("Empty")
holder_us = mean_us("Holder")  # an empty range's own length plus a nested range's whole cost
totals = {k: averages[k].cpu_time_total for k in ("GetNext", "Forward", "Loss", "Backward", "Optimizer")}
print("TORCH", json.dumps({"steps": steps, "totals_us": totals, "range_overhead_us": empty_us,
                           "nested_range_overhead_us": holder_us,
                           "counts": {k: averages[k].count for k in totals}}))
