"""torch.compile(model, backend="aot_eager"): the OptimizedModule trains and evaluates;
the graph counts dynamo reports must not change under profiling."""
# expect: {"train": 8, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "spans": {"Forward": 10}, "compilation": ["recompiles", "graph_breaks"]}
import json

import torch
import torch.nn as nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
cmodel = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(cmodel.parameters(), lr=0.05)
loss_fn = nn.MSELoss()
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8, drop_last=True)
val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
for epoch in range(2):
    cmodel.train()
    for x, y in train:
        opt.zero_grad()
        loss = loss_fn(cmodel(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
cmodel.eval()
with torch.no_grad():
    for x, y in val:
        print(f"val {loss_fn(cmodel(x), y).item():.4f}")
print("graph breaks", sum(counters["graph_break"].values()), "unique graphs", counters["stats"]["unique_graphs"])
print("compilation", json.dumps({"recompiles": sum(1 for m in get_compilation_metrics() if m.recompile_reason),
                                 "graph_breaks": len(counters["resumes"])}))
