"""nn.Module.compile(backend="aot_eager") in place, then training and a no_grad evaluation;
the module is saved with torch.save(state_dict)."""
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
model.compile(backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8, drop_last=True)
val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
model.eval()
with torch.no_grad():
    for x, y in val:
        print(f"val {nn.functional.mse_loss(model(x), y).item():.4f}")
torch.save(model.state_dict(), "weights.pth")
print("graph breaks", sum(counters["graph_break"].values()), "unique graphs", counters["stats"]["unique_graphs"])
print("compilation", json.dumps({"recompiles": sum(1 for m in get_compilation_metrics() if m.recompile_reason),
                                 "graph_breaks": len(counters["resumes"])}))
