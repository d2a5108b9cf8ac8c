"""Lightning fit over 3 epochs with validation after each, and epoch edges that take
time as real ones do (a callback's validation start-up and an end-of-epoch checkpoint,
40 ms each): 3 x 8 train batches, 3 x 6 validation batches. The edges are between
loops, in no step's time (the summary names them per epoch). The sanity check's 2 batches are no steps."""
# expect: {"train": 24, "eval": 18, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}}
import sys
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Edges(L.Callback):
    def on_validation_start(self, trainer, module):
        time.sleep(0.04)

    def on_train_epoch_end(self, trainer, module):
        time.sleep(0.04)
        print(f"epoch {trainer.current_epoch} val_loss {float(trainer.callback_metrics['val_loss']):.4f}")


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = [Edges()]
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 16), torch.randn(32, 1)), batch_size=4)
    val = DataLoader(TensorDataset(torch.randn(24, 16), torch.randn(24, 1)), batch_size=4)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    model = Model()
    trainer.fit(model, train, val)
    torch.save(model.state_dict(), "model.pt")
