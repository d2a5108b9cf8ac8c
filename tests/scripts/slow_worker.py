"""A 2-worker DataLoader whose worker 1 takes 10x longer per sample than worker 0
(no stepscope in here): python slow_worker.py [spawn]"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Uneven(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        worker = torch.utils.data.get_worker_info()
        time.sleep(0.02 if worker is not None and worker.id == 1 else 0.002)
        return torch.randn(8), torch.randn(1)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    context = sys.argv[1] if len(sys.argv) > 1 else None
    loader = DataLoader(Uneven(), batch_size=4, num_workers=2, multiprocessing_context=context)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print("steps", len(loader))
