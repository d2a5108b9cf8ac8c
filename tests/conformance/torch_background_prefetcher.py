"""A background thread reads the DataLoader into a queue (prefetch_generator's
BackgroundGenerator, or a DataLoader subclass whose __iter__ wraps it): 2 epochs x
8 batches. The loop's wait is a queue.get, not a fetch stepscope can see: no GetNext,
the thread's reads make no steps, and run.json says where the wait went."""
# expect: {"train": 16, "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "note": "read in a background thread"}
import queue
import threading

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class BackgroundGenerator(threading.Thread):
    def __init__(self, iterable, max_prefetch=2):
        super().__init__(daemon=True)
        self.queue = queue.Queue(max_prefetch)
        self.iterable = iterable
        self.start()

    def run(self):
        for item in self.iterable:
            self.queue.put(item)
        self.queue.put(None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.queue.get()
        if item is None:
            raise StopIteration
        return item


class DataLoaderX(DataLoader):
    def __iter__(self):
        return BackgroundGenerator(super().__iter__())


model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(128, 16), torch.randint(0, 4, (128,)))
loaders = [BackgroundGenerator(DataLoader(data, batch_size=16)), DataLoaderX(data, batch_size=16)]
for epoch, loader in enumerate(loaders):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, f"{loss.item():.4f}")
