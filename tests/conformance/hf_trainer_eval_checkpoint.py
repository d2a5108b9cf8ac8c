"""Hugging Face Trainer on a tiny model (no downloads) whose forward returns the loss:
2 epochs x 6 batches, evaluation (2 batches) after each epoch and once more at the end,
a checkpoint saved at each epoch (optimizer.pt, scheduler.pt, rng_state.pth: loaded by
the harness). The metrics printer is removed (its runtimes differ from run to run)."""
# expect: {"train": 12, "eval": 6, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"train": ["Loss"], "eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]}}
import sys

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import PrinterCallback, Trainer, TrainingArguments


class Data(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.transformers import StepscopeCallback

        callbacks.append(StepscopeCallback())
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, per_device_eval_batch_size=16,
                             num_train_epochs=2, logging_strategy="epoch", save_strategy="epoch",
                             eval_strategy="epoch", report_to=[], disable_tqdm=True, use_cpu=True, seed=0,
                             dataloader_num_workers=0)
    trainer = Trainer(model=Model(), args=args, train_dataset=Data(48, 0), eval_dataset=Data(32, 1),
                      callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    out = trainer.train()
    metrics = trainer.evaluate()
    print("global_step", out.global_step, "loss", round(out.training_loss, 4),
          "eval_loss", round(metrics["eval_loss"], 4))
