"""Lightning ModelCheckpoint (best by val_loss, and last.ckpt), then the best checkpoint
reloaded with load_from_checkpoint and validated again: 2 epochs x 4 train batches,
2 validation batches per epoch, then 2 more validation batches."""
# expect: {"train": 8, "eval": 6, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import sys

import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, hidden=16, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = [ModelCheckpoint(dirpath="checkpoints", filename="best-{epoch}", monitor="val_loss", save_last=True)]
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Model(), train, val)
    best = trainer.checkpoint_callback.best_model_path
    print("best", best.split("checkpoints")[-1])
    reloaded = Model.load_from_checkpoint(best)
    metrics = trainer.validate(reloaded, val, verbose=False)
    print(f"reloaded val_loss {metrics[0]['val_loss']:.4f} hidden {reloaded.hparams.hidden}")
