"""An unmodified DDP training script for torchrun (gloo, CPU)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
ds = TensorDataset(torch.randn(640, 16), torch.randn(640, 1))
loader = DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds))
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
dist.destroy_process_group()
print("rank done")
