"""Lightning manual optimization (automatic_optimization = False, manual_backward,
gradient clipping, two optimizers stepped every batch, a scheduler per epoch):
2 epochs x 4 batches = 8 train steps."""
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
        self.automatic_optimization = False
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))

    def training_step(self, batch, batch_idx):
        opt_enc, opt_head = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        opt_enc.zero_grad()
        opt_head.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt_enc, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt_enc.step()
        opt_head.step()
        self.log("loss", loss)

    def on_train_epoch_end(self):
        self.lr_schedulers().step()

    def configure_optimizers(self):
        opt_enc = torch.optim.SGD(self.encoder.parameters(), lr=0.05)
        opt_head = torch.optim.Adam(self.head.parameters(), lr=0.01)
        return [opt_enc, opt_head], [torch.optim.lr_scheduler.StepLR(opt_enc, 1, gamma=0.5)]


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
    trainer.fit(Model(), train)
    print("global_step", trainer.global_step, f"loss {trainer.callback_metrics['loss'].item():.4f}")
