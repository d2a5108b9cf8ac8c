"""Lightning's own LitAutoEncoder shape: training_step calls self.encoder and
self.decoder, never self(x): the two submodules are the roots found, and their
forwards are one Forward a step. 2 epochs x 4 batches, validation the same way."""
# expect: {"train": 8, "eval": 4, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "spans": {"Forward": 12}}
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class LitAutoEncoder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 16))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        x_hat = self.decoder(self.encoder(x))
        loss = nn.functional.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", nn.functional.mse_loss(self.decoder(self.encoder(x)), x))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 16)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 16)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        num_sanity_val_steps=0)
    trainer.fit(LitAutoEncoder(), train, val)
    print("global_step", trainer.global_step)
    print(f"val_loss {trainer.callback_metrics['val_loss'].item():.4f}")
