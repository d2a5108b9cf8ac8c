"""Lightning fit, then LightningModule.to_torchscript() saved to a file (the harness
loads it with torch.jit.load in a clean process)."""
# expect: {"train": 8, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    model = Model()
    trainer.fit(model, train)
    scripted = model.to_torchscript(file_path="model.ts.pt")
    print(scripted.code.strip())
