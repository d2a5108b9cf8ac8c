"""Lightning with the user's own profiler="simple": its report is still printed in
full (the same actions, with the same call counts; rows of stepscope's own callback
aside); 2 epochs x 4 batches, 2 validation batches per epoch."""
# expect: {"train": 8, "eval": 4, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]},
# expect:  "same_lines": "^\\|\\s+(?!Total\\b)(?![^|]*Stepscope)(\\S[^|\\t]*?)\\s*\\t\\|[^|]*\\|\\s+(\\d+)\\s"}
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        profiler="simple")
    trainer.fit(Model(), train, val)
    print("global_step", trainer.global_step, f"val_loss {trainer.callback_metrics['val_loss'].item():.4f}")
