"""User backward hooks that change gradients: a full backward hook on a module scaling
its grad_input, a tensor hook clipping the activation's gradient, and a post-accumulate
hook on a parameter."""
# expect: {"train": 8, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 8, "Backward": 8}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if h.requires_grad:
            h.register_hook(lambda g: g.clamp(-0.01, 0.01))
        return self.fc2(h)


model = Net()
calls = {"module": 0, "param": 0}


def halve(module, grad_input, grad_output):
    calls["module"] += 1
    return tuple(None if g is None else g * 0.5 for g in grad_input)


def count(param):
    calls["param"] += 1


model.fc2.register_full_backward_hook(halve)
model.fc1.weight.register_post_accumulate_grad_hook(count)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f} calls {calls} grad {model.fc1.weight.grad.abs().sum().item():.4f}")
