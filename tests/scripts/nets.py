"""Small models for tests, importable where stepscope is not (loading pickles)."""

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)
