"""An unmodified Hugging Face Trainer script: python hf_trainer.py [plain|callback] ACCUM [eval]

A tiny regression model (no downloads); 96 samples, batch 8, 2 epochs; with
`eval`, an evaluation over 32 samples (batch 16) after each epoch."""
import sys

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


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
    how, accum = sys.argv[1], int(sys.argv[2])
    evaluate = len(sys.argv) > 3 and sys.argv[3] == "eval"
    callbacks = []
    if how == "callback":
        from stepscope.integrations.transformers import StepscopeCallback

        callbacks.append(StepscopeCallback())
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, per_device_eval_batch_size=16,
                             gradient_accumulation_steps=accum, num_train_epochs=2, logging_steps=1000,
                             save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True,
                             eval_strategy="epoch" if evaluate else "no", seed=0)
    trainer = Trainer(model=Model(), args=args, train_dataset=Data(96, 0),
                      eval_dataset=Data(32, 1) if evaluate else None, callbacks=callbacks)
    out = trainer.train()
    print("global_step", out.global_step, "loss", round(out.training_loss, 4))
