"""User hooks that change what modules see and return: a forward pre-hook scaling the
input, a forward hook on the model adding to its output, one with kwargs on a submodule."""
# expect: {"train": 8, "eval": 1,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}, "spans": {"Forward": 9}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
calls = {"pre": 0, "post": 0, "kw": 0}


def scale_input(module, args):
    calls["pre"] += 1
    return (args[0] * 0.5,)


def shift_output(module, args, output):
    calls["post"] += 1
    return output + 1.0


def clamp_hidden(module, args, kwargs, output):
    calls["kw"] += 1
    return output.clamp(min=-2.0, max=2.0)


model.register_forward_pre_hook(scale_input)
model.register_forward_hook(shift_output)
model[0].register_forward_hook(clamp_hidden, with_kwargs=True)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    out = model(torch.ones(2, 8))
print(f"loss {loss.item():.4f} out {out.flatten().tolist()[0]:.4f} calls {calls}")
