"""A compiled model whose forward branches on a value (a graph break) and whose loader's
last batch is short (no drop_last: a recompile for the new batch size, every epoch's last
step after the first). The compile counts stepscope records must equal dynamo's own."""
# expect: {"train": 15, "eval": 0,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]},
# expect:  "compilation": ["recompiles", "graph_breaks"]}
import json

import torch
import torch.nn as nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.mean() > 0.2:  # a branch on a value: dynamo breaks the graph here
            h = h * 0.5
        return self.b(h)


model = Net()
cmodel = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(cmodel.parameters(), lr=0.05)
loss_fn = nn.MSELoss()
train = DataLoader(TensorDataset(torch.randn(36, 8), torch.randn(36, 1)), batch_size=8)  # 4 full, then 4 rows
for epoch in range(3):
    for x, y in train:
        opt.zero_grad()
        loss = loss_fn(cmodel(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
metrics = get_compilation_metrics()
places = set(counters["resumes"])  # a break resumes in a function of its own (one per place)
print("compilation", json.dumps({"recompiles": sum(1 for m in metrics if m.recompile_reason and not m.fail_type),
                                 "graph_breaks": len(places)}))
