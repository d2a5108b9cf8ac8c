"""WGAN-GP: the critic's loss has a gradient penalty computed with
torch.autograd.grad(create_graph=True) before its backward; 2 critic steps per
generator step. A train step is one iteration (6 iterations, 18 optimizer steps)."""
# expect: {"train": 6, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}, "spans": {"Optimizer": 18}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
C = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.0, 0.9))
opt_c = torch.optim.Adam(C.parameters(), lr=1e-3, betas=(0.0, 0.9))
data = DataLoader(TensorDataset(torch.randn(48, 8) + 1.0), batch_size=8)


def gradient_penalty(real, fake):
    alpha = torch.rand(real.size(0), 1)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    grads, = torch.autograd.grad(C(mixed).sum(), mixed, create_graph=True)
    return ((grads.norm(2, dim=1) - 1) ** 2).mean()


for (real,) in data:
    for _ in range(2):
        fake = G(torch.randn(real.size(0), 4)).detach()
        opt_c.zero_grad()
        loss_c = C(fake).mean() - C(real).mean() + 10.0 * gradient_penalty(real, fake)
        loss_c.backward()
        opt_c.step()
    opt_g.zero_grad()
    loss_g = -C(G(torch.randn(real.size(0), 4))).mean()
    loss_g.backward()
    opt_g.step()
print(f"loss_c {loss_c.item():.4f} loss_g {loss_g.item():.4f}")
