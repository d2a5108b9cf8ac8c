"""An ordinary Lightning script: the stepscope callback is its only addition.

    python3 examples/lightning_fit.py                 # with the callback (one line, below)
    STEPSCOPE=1 python3 examples/lightning_fit.py --no-callback   # zero edits: the callback is injected

Trains a small MLP with validation each epoch; stepscope records train and eval
steps with GetNext, Forward, Loss, Backward and Optimizer, keeps Lightning's own
action names in the trace, and writes the run under ./stepscope-runs/.
Then: `stepscope summary <run>` and `stepscope report <run>`.
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-callback", action="store_true", help="rely on STEPSCOPE=1 to add it")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    w = torch.randn(64, 1)
    x = torch.randn(4096, 64)
    data = TensorDataset(x, x @ w + 0.1 * torch.randn(4096, 1))
    train, val = torch.utils.data.random_split(data, [3584, 512])
    callbacks = []
    if not args.no_callback:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        callbacks=callbacks)
    trainer.fit(Regressor(), DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, batch_size=256))


if __name__ == "__main__":
    main()
