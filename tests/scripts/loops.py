"""Unmodified PyTorch training loops (no stepscope in here): python loops.py KIND [N]."""
import sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def main():
    torch.manual_seed(0)
    kind = sys.argv[1]
    N = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 12
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    if kind == "manual":  # no optimizer, no DataLoader, manual SGD, loss by expression
        for i in range(N):
            out = model(x)
            loss = ((out - y) ** 2).mean()
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
    elif kind == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        for i in range(N):
            opt.step(closure)
    elif kind == "accum":
        opt = torch.optim.Adam(model.parameters())
        for i in range(N):
            for micro in range(4):
                loss = nn.functional.mse_loss(model(x), y) / 4
                loss.backward()
            opt.step()
            opt.zero_grad()
    elif kind in ("gan", "gan_mixed"):  # gan_mixed: optimizers of two classes (each told by its range)
        G = nn.Sequential(nn.Linear(8, 16))
        D = nn.Sequential(nn.Linear(16, 1))
        oG = torch.optim.Adam(G.parameters())
        oD = torch.optim.Adam(D.parameters()) if kind == "gan" else torch.optim.SGD(D.parameters(), lr=0.01)
        bce = nn.BCEWithLogitsLoss()
        for i in range(N):
            z = torch.randn(32, 8)
            real = torch.randn(32, 16)
            oD.zero_grad()
            d_loss = bce(D(real), torch.ones(32, 1)) + bce(D(G(z).detach()), torch.zeros(32, 1))
            d_loss.backward()
            oD.step()
            oG.zero_grad()
            g_loss = bce(D(G(z)), torch.ones(32, 1))
            g_loss.backward()
            oG.step()
    elif kind == "ckpt":
        class M(nn.Module):
            def __init__(s):
                super().__init__()
                s.a = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
                s.b = nn.Linear(64, 1)
            def forward(s, x):
                return s.b(checkpoint(s.a, x, use_reentrant=False))
        m = M()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for i in range(N):
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    elif kind in ("compile", "mcompile"):
        if kind == "compile":
            m = torch.compile(model, backend=sys.argv[3])
        else:
            model.compile(backend=sys.argv[3])
            m = model
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(N):
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        from torch._dynamo.utils import counters
        print("GRAPH_BREAKS", dict(counters["graph_break"]))
    elif kind == "fullgraph":  # eager steps first (the model and loss are roots), then compiled in one graph
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.MSELoss()
        def forward_loss(x, y):
            return loss_fn(model(x), y)
        for i in range(N // 2):
            opt.zero_grad()
            forward_loss(x, y).backward()
            opt.step()
        step = torch.compile(forward_loss, fullgraph=True, backend=sys.argv[3])  # any graph break raises
        whole = torch.compile(model, fullgraph=True, backend=sys.argv[3])
        for i in range(N - N // 2):
            opt.zero_grad()
            step(x, y).backward()
            opt.step()
        with torch.no_grad():
            print("LOSS", round(float(loss_fn(whole(x), y)), 6))
    elif kind == "evalonly":
        model.eval()
        with torch.no_grad():
            for i in range(N):
                model(x)
    elif kind in ("loader", "loader_spawn", "loader_forkserver"):
        from torch.utils.data import DataLoader, TensorDataset
        ds = TensorDataset(torch.randn(N * 32, 16), torch.randn(N * 32, 1))
        ctx = {"loader_spawn": "spawn", "loader_forkserver": "forkserver"}.get(kind)
        loader = DataLoader(ds, batch_size=32, num_workers=2, multiprocessing_context=ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        crit = nn.MSELoss()
        for epoch in range(2):
            model.train()
            for xb, yb in loader:
                opt.zero_grad()
                loss = crit(model(xb), yb)
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                for xb, yb in loader:
                    model(xb)
    print("done", kind)


if __name__ == "__main__":  # spawn workers import this file
    main()
