"""Ctrl-C during a forward, and the program's own handler: the user presses Ctrl-C
(SIGINT) in the 9th iteration's forward; `except KeyboardInterrupt` saves the model and
the job exits 0. 8 optimizer steps ran: 8 train steps; the 9th iteration stays on the
timeline as an interrupted step, counted as no train step."""
# expect: {"train": 8, "interrupted": 1,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import signal

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
# Ctrl-C raises KeyboardInterrupt even where the parent ignores SIGINT (a shell's background
# job starts its children so, and Python then keeps it ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 9:
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C arrives inside this forward
        return self.body(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(128, 8), torch.randn(128, 1)), batch_size=8)
steps = 0
try:
    for epoch in range(2):
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            print(f"step {steps} loss {loss.item():.4f}")
except KeyboardInterrupt:
    print(f"interrupted after {steps} steps: saving")
torch.save(model.state_dict(), "model.pt")
