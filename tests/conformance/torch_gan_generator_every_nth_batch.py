"""WGAN with n_critic (as PyTorch-GAN's wgan_gp.py): the critic steps on every
batch, the generator on every 5th, after the critic, on the same batch. A train
step is one iteration of the loader's loop: 10 batches are 10 steps, 12
optimizer steps (the generator's first step too is part of its batch's step)."""
# expect: {"train": 10, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}, "spans": {"Optimizer": 12}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
n_critic = 5
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
data = DataLoader(TensorDataset(torch.randn(80, 8) + 1.0), batch_size=8)

for i, (real,) in enumerate(data):
    opt_d.zero_grad()
    fake = G(torch.randn(real.size(0), 4))
    loss_d = D(fake.detach()).mean() - D(real).mean()
    loss_d.backward()
    opt_d.step()
    for p in D.parameters():
        p.data.clamp_(-0.01, 0.01)
    if i % n_critic == n_critic - 1:
        opt_g.zero_grad()
        loss_g = -D(G(torch.randn(real.size(0), 4))).mean()
        loss_g.backward()
        opt_g.step()
        print(f"batch {i} loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")
