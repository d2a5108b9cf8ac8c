"""Lightning with validation twice per epoch (val_check_interval=0.5) and
limit_train_batches: 2 epochs x 6 of 8 batches, 2 validation batches at each check."""
# expect: {"train": 12, "eval": 8, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.checks = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.checks += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=6, val_check_interval=0.5, accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    model = Model()
    trainer.fit(model, train, val)
    print("global_step", trainer.global_step, "validation checks", model.checks,
          f"val_loss {trainer.callback_metrics['val_loss'].item():.4f}")
