"""Code already annotated for other profilers: torch.profiler.record_function (a
context manager in forward, a decorator on the loss, one around each epoch), the nvtx
package (annotate as a decorator and a context manager, push/pop in a domain, mark),
torch.cuda.nvtx on a build without NVTX (it raises, as without stepscope). The model
is then scripted (its record_function compiles into TorchScript) and saved, and a
compiled model is evaluated (dynamo leaves profiler ranges out of its graphs)."""
# expect: {"train": 8, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "spans": {"Forward": 12},
# expect:  "annotations": {"epoch": 2, "block": 8, "loss_of": 8, "backward_pass": 8, "optimizer": 8,
# expect:                  "log_metrics": 2, "epoch_end": 2}}
import nvtx
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("block"):
            h = torch.relu(self.fc1(x))
        return self.fc2(h)


@torch.profiler.record_function("loss_of")
def loss_of(out, y):
    return nn.functional.cross_entropy(out, y)


@nvtx.annotate(color="green")
def log_metrics(loss):
    print(f"loss {loss.item():.4f}")


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))), batch_size=8)
for epoch in range(2):
    with torch.profiler.record_function("epoch"):
        for x, y in data:
            opt.zero_grad()
            loss = loss_of(model(x), y)
            with nvtx.annotate("backward_pass", color="red"):
                loss.backward()
            nvtx.push_range("optimizer", domain="train")
            opt.step()
            nvtx.pop_range(domain="train")
        log_metrics(loss)
    nvtx.mark("epoch_end")
try:
    torch.cuda.nvtx.range_push("cuda range")
    torch.cuda.nvtx.range_pop()
    print("torch.cuda.nvtx: available")
except RuntimeError as exc:
    print(f"torch.cuda.nvtx: {exc}")
scripted = torch.jit.script(model)
scripted.save("scripted.pt")
print(scripted.code.strip())


compiled = torch.compile(model, backend="eager")
model.eval()
with torch.no_grad():
    correct = sum(int((compiled(x).argmax(1) == y).sum()) for x, y in data)
print(f"accuracy {correct / 32:.3f}")
