"""Lightning's strategy="ddp_spawn" on 2 CPU processes, with the user's own
profiler="simple": the trainer, its callbacks and its profiler are pickled to the
spawned processes (stepscope's callback and profiler tap included). Rank 0
prints the actions its profiler recorded, with their call counts: stepscope's own
hooks are among them only where the script added the callback itself.
2 epochs x 2 batches and 1 validation batch per rank."""
# expect: {"train": 8, "eval": 4, "callback": true,
# expect:  "ranks": {"0": {"train": 4, "eval": 2}, "1": {"train": 4, "eval": 2}},
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}, "ddp_buckets": {"0": 4, "1": 4},
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
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_fit_end(self):
        # (a callback the script adds is profiled like any other: leave its own rows out)
        ours = "StepscopeCallback" if "--callback" in sys.argv else None
        actions = {name: len(times) for name, times in self.trainer.profiler.recorded_durations.items()
                   if not (ours and ours in name)}
        if self.global_rank == 0:
            print("actions", sorted(actions.items()), flush=True)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.lightning import StepscopeCallback

        callbacks.append(StepscopeCallback())
    train = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=callbacks, profiler="simple")
    trainer.fit(Model(), train, val)
    print("global_step", trainer.global_step, f"val_loss {trainer.callback_metrics['val_loss'].item():.4f}")
