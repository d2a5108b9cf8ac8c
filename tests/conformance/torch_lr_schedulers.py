"""LR schedulers: a per-batch warmup (LambdaLR) chained with a per-epoch StepLR, and
ReduceLROnPlateau on the validation loss; 3 epochs x 4 batches, 2 validation batches each."""
# expect: {"train": 12, "eval": 6,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau, StepLR
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
warmup = LambdaLR(opt, lambda step: min(1.0, (step + 1) / 6))
decay = StepLR(opt, step_size=1, gamma=0.5)
plateau = ReduceLROnPlateau(opt, patience=0, factor=0.5)
train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
for epoch in range(3):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        warmup.step()
    decay.step()
    model.eval()
    with torch.no_grad():
        val_loss = sum(nn.functional.mse_loss(model(x), y).item() for x, y in val) / len(val)
    plateau.step(val_loss)
    print(f"epoch {epoch} loss {loss.item():.4f} val {val_loss:.4f} lr {opt.param_groups[0]['lr']:.5f}")
