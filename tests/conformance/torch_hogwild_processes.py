"""Hogwild training (pytorch/examples' mnist_hogwild): a shared-memory model
trained by 2 processes started with the spawn method, each with its own
DataLoader and optimizer (2 epochs x 8 batches each), then evaluated in the
parent (4 batches). The children's updates race, so only facts are printed."""
# expect: {"train": 32, "eval": 4,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]}}
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(rank, model, dataset):
    torch.manual_seed(1 + rank)
    torch.set_num_threads(1)
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    model.train()
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dataset = TensorDataset(torch.randn(128, 20), torch.randint(0, 4, (128,)))
    model = Net()
    model.share_memory()
    processes = [mp.Process(target=train, args=(rank, model, dataset)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("exit codes", [p.exitcode for p in processes])
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=32):
            total += F.nll_loss(model(x), y, reduction="sum").item()
    print("evaluated", total > 0)
