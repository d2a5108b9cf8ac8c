"""Knowledge distillation: a teacher trained first, then a student trained on the
teacher's outputs (the teacher runs in eval mode under no_grad inside each student
step: part of that train step, not an eval batch). 6 + 6 train steps, 18 forwards."""
# expect: {"train": 12, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Forward": 18}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
data = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 1)), batch_size=8)
teacher = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(teacher.parameters(), lr=0.05)
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.mse_loss(teacher(x), y)
    loss.backward()
    opt.step()
print(f"teacher {loss.item():.4f}")
teacher.eval()
student = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))
opt = torch.optim.SGD(student.parameters(), lr=0.05)
for x, y in data:
    with torch.no_grad():
        target = teacher(x)
    opt.zero_grad()
    loss = nn.functional.mse_loss(student(x), target)
    loss.backward()
    opt.step()
print(f"student {loss.item():.4f}")
