"""The optimizer step compiled on its own (torch.compile of a function calling
opt.step(), as in PyTorch's "compiled optimizer" recipe; backend aot_eager), forward
and backward eager, over a DataLoader, the first layer frozen: dynamo folds the
optimizer's hooks away, so the step is told by a trained parameter changing inside
the compiled call.
The graph counts dynamo reports must not change under profiling."""
# expect: {"train": 8,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]},
# expect:  "spans": {"Forward": 8, "Optimizer": 8}, "compilation": ["recompiles", "graph_breaks"]}
import json

import torch
import torch.nn as nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model[0].requires_grad_(False)  # a frozen first layer, still in the optimizer (fine-tuning): never updated
opt = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()


@torch.compile(backend="aot_eager")
def opt_step():
    opt.step()


train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8, drop_last=True)
for epoch in range(2):
    for x, y in train:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt_step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
print("unique graphs", counters["stats"]["unique_graphs"])
print("compilation", json.dumps({"recompiles": sum(1 for m in get_compilation_metrics() if m.recompile_reason),
                                 "graph_breaks": len(counters["resumes"])}))
