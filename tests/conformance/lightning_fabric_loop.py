"""Lightning Fabric: the user's own loop, with Fabric's wrappers around the model,
the optimizer and the loaders (`fabric.setup`, `fabric.backward`), bf16 autocast,
gradient accumulation under `no_backward_sync`, clipping, validation after each
epoch, and a checkpoint saved and loaded with `fabric.save`/`fabric.load`.

2 epochs x 8 batches, 2 micro-batches per optimizer step: 8 train steps; 2
validation batches after each epoch: 4 eval steps.
"""
# expect: {"train": 8, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "spans": {"Forward": 20, "Optimizer": 8}}
import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    L.seed_everything(0, verbose=False)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    fabric.launch()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = fabric.setup(model, opt)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
    train, val = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=8),
                                          DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8))
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(2):
        model.train()
        for i, (xb, yb) in enumerate(train):
            accumulating = i % 2 == 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = loss_fn(model(xb), yb)
                fabric.backward(loss / 2)
            if not accumulating:
                fabric.clip_gradients(model, opt, max_norm=1.0)
                opt.step()
                opt.zero_grad()
        model.eval()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(xb), yb).item() for xb, yb in val) / len(val)
        fabric.print(f"epoch {epoch} loss {loss.item():.4f} val {val_loss:.4f}")
    fabric.save("checkpoint.ckpt", {"model": model, "optimizer": opt, "epoch": 2})
    state = {"model": model, "optimizer": opt, "epoch": 0}
    fabric.load("checkpoint.ckpt", state)
    print("resumed at epoch", state["epoch"])


if __name__ == "__main__":
    main()
