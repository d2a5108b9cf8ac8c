"""A GAN: discriminator and generator, two optimizers, two backward passes per
iteration; a train step is one iteration (6 iterations)."""
# expect: {"train": 6, "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
real_data = DataLoader(TensorDataset(torch.randn(48, 8) + 1.0), batch_size=8)
for (real,) in real_data:
    z = torch.randn(real.size(0), 4)
    fake = G(z)
    opt_d.zero_grad()
    loss_d = bce(D(real), torch.ones(real.size(0), 1)) + bce(D(fake.detach()), torch.zeros(real.size(0), 1))
    loss_d.backward()
    opt_d.step()
    opt_g.zero_grad()
    loss_g = bce(D(fake), torch.ones(real.size(0), 1))
    loss_g.backward()
    opt_g.step()
print(f"loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")
