"""An unmodified Lightning script: python lightning_fit.py [callback|plain] [profiler|ddp|recording]

`recording`: a custom Profiler that prints every call it receives (the calls a
user's profiler sees must be the same with and without stepscope)."""
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    callbacks = []
    if sys.argv[1] == "callback":
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    data = TensorDataset(torch.randn(640, 32), torch.randn(640, 1))
    extra = sys.argv[2] if len(sys.argv) > 2 else None
    parallel = dict(accelerator="cpu", devices=2, strategy="ddp") if extra == "ddp" else {}
    profiler = None if extra == "ddp" else extra
    if extra == "recording":
        from lightning.pytorch.profilers import Profiler

        class Recording(Profiler):
            calls = []

            def start(self, action_name):
                self.calls.append(("start", action_name))

            def stop(self, action_name):
                self.calls.append(("stop", action_name))

            def setup(self, stage, local_rank=None, log_dir=None):
                self.calls.append(("setup", stage))
                super().setup(stage, local_rank, log_dir)

            def teardown(self, stage):
                self.calls.append(("teardown", stage))
                super().teardown(stage)

            def describe(self):
                self.calls.append(("describe",))

            def summary(self):
                return ""

        profiler = Recording()
    trainer = L.Trainer(max_epochs=2, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, callbacks=callbacks, profiler=profiler, **parallel)
    trainer.fit(Model(), DataLoader(data, batch_size=32), DataLoader(data, batch_size=64))
    print("fitted", trainer.global_step)
    if extra == "recording":
        calls = [c for c in profiler.calls if "StepscopeCallback" not in str(c)]
        print("calls", len(profiler.calls), len(calls), calls[:3], calls[-3:])
