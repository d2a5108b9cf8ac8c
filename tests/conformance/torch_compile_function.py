"""torch.compile (backend aot_eager) of a plain function that calls the model;
the graph counts dynamo reports must not change under profiling. After the loop a
compiled function of plain tensors (no model, no gradients) is no step."""
# expect: {"train": 8, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "compilation": ["recompiles", "graph_breaks"]}
import json

import torch
import torch.nn as nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)


def predict(x):
    return torch.tanh(model(x)) * 2.0


predict_c = torch.compile(predict, backend="aot_eager")
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8, drop_last=True)
val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.mse_loss(predict_c(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
model.eval()
with torch.no_grad():
    for x, y in val:
        print(f"val {nn.functional.mse_loss(predict_c(x), y).item():.4f}")
postprocess = torch.compile(lambda t: (torch.sin(t) + 1.0).sum(), backend="aot_eager")
print(f"post {postprocess(torch.linspace(0, 1, 5)).item():.4f}")
print("graph breaks", sum(counters["graph_break"].values()), "unique graphs", counters["stats"]["unique_graphs"])
print("compilation", json.dumps({"recompiles": sum(1 for m in get_compilation_metrics() if m.recompile_reason),
                                 "graph_breaks": len(counters["resumes"])}))
