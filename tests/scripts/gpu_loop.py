"""An unmodified PyTorch training loop on CUDA (no stepscope in here), for tests marked gpu.

python gpu_loop.py train STEPS   a DataLoader with pinned batches moved with .to(cuda),
                                  loss.item() every step, torch.cuda.synchronize() at the end of each
python gpu_loop.py steady SECONDS a steady matmul load (no host syncs but one per 50 ms)
python gpu_loop.py profiler STEPS train, with torch.profiler opened for a few steps in the middle
"""
import sys
import time

import torch
import torch.nn as nn

BATCH, FEATURES = 64, 1024  # x: 64*1024*4 = 262144 bytes, y: 64*8 = 512 bytes per batch


def train(steps, profile_steps=None):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * steps, FEATURES), torch.randint(0, 10, (BATCH * steps,)))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, pin_memory=True)
    model = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = None
    for i, (x, y) in enumerate(loader):
        if profile_steps and i == profile_steps[0]:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                      torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {i} loss {loss.item():.4f}")
        torch.cuda.synchronize()
        if prof is not None and i == profile_steps[1]:
            prof.__exit__(None, None, None)
            print("profiler events", len(prof.events()))
            prof = None


def steady(seconds):
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(8):
            a = torch.tanh(a @ a * 1e-4)
        torch.cuda.synchronize()
        time.sleep(0.02)  # about half busy: NVML and the kernels must agree on how much


if __name__ == "__main__":
    kind, n = sys.argv[1], int(sys.argv[2])
    if kind == "train":
        train(n)
    elif kind == "profiler":
        train(n, profile_steps=(3, 5))
    else:
        steady(n)
