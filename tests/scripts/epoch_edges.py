"""A healthy multi-epoch fit with validation after each epoch, whose epoch edges take
time as real ones do (no stepscope in here): python epoch_edges.py lightning|torch.

4 epochs x 16 train batches, 8 validation batches each; validation start-up (a callback,
a loader's start) and each epoch's end (a checkpoint) take 60 ms. Prints loop_ns: the
wall time from the first epoch's start to the last validation's end."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS, EDGE_S = 4, 0.06
torch.manual_seed(0)
torch.set_num_threads(1)


def loaders():
    def data(n):
        return DataLoader(TensorDataset(torch.randn(n, 16), torch.randn(n, 1)), batch_size=4)

    return data(64), data(32)


def net():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))


def with_lightning():
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            time.sleep(0.004)  # the step's own work, steady
            return nn.functional.mse_loss(self(batch[0]), batch[1])

        def validation_step(self, batch, i):
            time.sleep(0.002)
            return nn.functional.mse_loss(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Edges(L.Callback):
        def on_train_start(self, trainer, module):
            self.t0 = time.perf_counter_ns()

        def on_validation_start(self, trainer, module):
            time.sleep(EDGE_S)  # validation start-up

        def on_train_epoch_end(self, trainer, module):
            time.sleep(EDGE_S)  # a checkpoint
            if trainer.current_epoch == EPOCHS - 1:
                print("loop_ns", time.perf_counter_ns() - self.t0)

    train, val = loaders()
    trainer = L.Trainer(max_epochs=EPOCHS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[Edges()])
    trainer.fit(Model(), train, val)


def with_torch():
    model, (train, val) = net(), loaders()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter_ns()
    for epoch in range(EPOCHS):
        model.train()
        for x, y in train:
            time.sleep(0.004)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        model.eval()
        time.sleep(EDGE_S)  # validation start-up
        with torch.no_grad():
            for x, y in val:
                time.sleep(0.002)
                model(x)
        time.sleep(EDGE_S)  # a checkpoint
    print("loop_ns", time.perf_counter_ns() - t0)


with_lightning() if sys.argv[1] == "lightning" else with_torch()
