"""Real training patterns that were miscounted (no stepscope in here): python patterns.py KIND.

Prints the truth it knows (wall time of the loop, step counts) for the test to compare."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Normalize(nn.Module):  # a transform that is an nn.Module, as torchvision's are
    def forward(self, x):
        return (x - x.mean()) / (x.std() + 1e-6)


class Transformed(Dataset):
    def __init__(self, n):
        self.x, self.y, self.t = torch.randn(n, 16), torch.randn(n, 1), Normalize()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.t(self.x[i]), self.y[i]


def model_and_opt():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model, opt, x, y):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def main():
    torch.manual_seed(0)
    kind = sys.argv[1]
    model, opt = model_and_opt()
    data = TensorDataset(torch.randn(48, 16), torch.randn(48, 1))
    if kind == "forkbreak":  # eval over a 2-worker loader left with break, then a fresh iterator
        loader = DataLoader(data, batch_size=4, num_workers=2)
        model.eval()
        for epoch in range(2):
            with torch.no_grad():
                for i, (x, y) in enumerate(loader):
                    model(x)
                    if i == 5:
                        break
        print("eval steps", 12)
    elif kind == "epochs":  # non-persistent workers: iter(loader) starts them each epoch
        loader = DataLoader(data, batch_size=8, num_workers=2)
        t0 = time.perf_counter_ns()
        for epoch in range(3):
            for x, y in loader:
                train_step(model, opt, x, y)
        print("loop_ns", time.perf_counter_ns() - t0)
    elif kind == "acting":  # DQN: a no_grad forward chooses an action, then one update, every iteration
        buffer = []
        t0 = None
        for it in range(30):
            if it == 10:
                t0 = time.perf_counter_ns()  # (warm-up before it: acting only)
            with torch.no_grad():
                model(torch.randn(1, 16))
            time.sleep(0.002)  # the environment's step
            buffer.append(torch.randn(1, 16))
            if len(buffer) >= 10:
                train_step(model, opt, torch.cat(buffer[-8:]), torch.randn(8, 1))
        print("loop_ns", time.perf_counter_ns() - t0)
    elif kind == "model_with_loss":  # a wrapper named like a loss that holds the model (CenterNet's)
        class ModelWithLoss(nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, x, y):
                out = self.model(x)
                return out, nn.functional.mse_loss(out, y)

        wrapped = ModelWithLoss(model)
        for i in range(6):
            x, y = torch.randn(8, 16), torch.randn(8, 1)
            opt.zero_grad()
            wrapped(x, y)[1].backward()
            opt.step()
    elif kind == "fullbatch":  # one fetch, then many optimizer steps
        x, y = next(iter(DataLoader(data, batch_size=48)))
        for _ in range(30):
            train_step(model, opt, x, y)
    elif kind in ("transform_train", "transform_eval"):  # nn.Module transforms inside the fetch
        loader = DataLoader(Transformed(32), batch_size=8)
        order = ["train", "eval"] if kind == "transform_train" else ["eval", "train"]
        for mode in order:
            if mode == "train":
                model.train()
                for x, y in loader:
                    train_step(model, opt, x, y)
            else:
                model.eval()
                with torch.no_grad():
                    for x, y in loader:
                        model(x)
    elif kind == "step_raises":  # an optimizer step that raises once, caught: the job goes on
        class Flaky(torch.optim.SGD):
            calls = 0

            def step(self, closure=None):
                Flaky.calls += 1
                if Flaky.calls == 3:
                    raise FloatingPointError("gradient overflow, skipped")
                return super().step(closure)

        opt = Flaky(model.parameters(), lr=0.01)
        for x, y in DataLoader(data, batch_size=8):
            try:
                train_step(model, opt, x, y)
            except FloatingPointError:
                pass
    elif kind == "wrapped_optimizer":  # Lookahead-style: its step steps an inner optimizer
        class Lookahead(torch.optim.Optimizer):
            def __init__(self, inner):
                self.inner = inner
                super().__init__(inner.param_groups, {})

            def step(self, closure=None):
                return self.inner.step(closure)

        opt = Lookahead(torch.optim.SGD(model.parameters(), lr=0.01))
        for x, y in DataLoader(data, batch_size=8):
            train_step(model, opt, x, y)
    elif kind == "direct_forward":  # net.forward(x), calling backbone.forward(x): both directly
        class Backbone(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 32)

            def forward(self, x):
                return self.b(torch.relu(self.a(x)))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.backbone, self.head = Backbone(), nn.Linear(32, 1)

            def forward(self, x):
                return self.head(torch.relu(self.backbone.forward(x)))

        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for x, y in DataLoader(data, batch_size=8):  # 6 train steps
            opt.zero_grad()
            nn.functional.mse_loss(net.forward(x), y).backward()
            opt.step()
        net.eval()
        with torch.no_grad():  # 4 eval steps, no loader: each forward is one
            for x in [torch.randn(8, 16) for _ in range(4)]:
                net.forward(x)
        # a teacher and a student called as modules stay two forwards a step
        teacher, student = model_and_opt()[0].eval(), model_and_opt()[0]
        opt = torch.optim.SGD(student.parameters(), lr=0.01)
        for x, y in DataLoader(data, batch_size=16):  # 3 train steps
            opt.zero_grad()
            with torch.no_grad():
                target = teacher(x)
            nn.functional.mse_loss(student(x), target).backward()
            opt.step()
    elif kind == "second_model":  # a second model (and optimizer) trained after the first
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        for _ in range(6):
            train_step(model, opt, x, y)
        model2, opt2 = model_and_opt()
        for _ in range(6):
            train_step(model2, opt2, x, y)
    elif kind == "threads":  # two loops at once, in two threads; one with a loader, one without
        import threading

        loop_ns = {}

        def loop(name, with_loader):
            m, o = model_and_opt()
            t0 = time.perf_counter_ns()
            if with_loader:
                for _ in range(2):
                    for x, y in DataLoader(data, batch_size=4):
                        train_step(m, o, x, y)
            else:
                x, y = torch.randn(8, 16), torch.randn(8, 1)
                for _ in range(20):
                    train_step(m, o, x, y)
            loop_ns[name] = time.perf_counter_ns() - t0

        threads = [threading.Thread(target=loop, args=("loader", True)),
                   threading.Thread(target=loop, args=("plain", False))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("loop_ns", loop_ns["loader"], loop_ns["plain"])
    elif kind == "stranded":
        # A thread's first call of its model is running when the main loop, starting a
        # new DataLoader pass, runs its own known model: the order that ended root
        # discovery inside the other thread's call (seen once, two threads under load).
        import threading

        entered, release = threading.Event(), threading.Event()

        class Slow(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 1)

            def forward(self, x):
                if not entered.is_set():
                    entered.set()
                    release.wait(30)  # the GIL is free meanwhile
                return self.fc(x)

        slow = Slow()
        slow_opt = torch.optim.SGD(slow.parameters(), lr=0.01)  # known before the main loop
        for _ in range(3):  # the main loop's model is found; discovery ends
            for x, y in DataLoader(data, batch_size=8):
                train_step(model, opt, x, y)

        def other():
            x, y = torch.randn(8, 16), torch.randn(8, 1)
            for _ in range(4):
                train_step(slow, slow_opt, x, y)

        thread = threading.Thread(target=other)
        it = iter(DataLoader(data, batch_size=8))  # a new pass: discovery looks until a known root runs
        x, y = next(it)
        thread.start()
        entered.wait(30)  # the other thread's first forward is inside its discovered call
        train_step(model, opt, x, y)  # a known root runs: discovery may end
        release.set()
        thread.join()
        for x, y in it:
            train_step(model, opt, x, y)
    elif kind == "first_fetch":
        # Two loops in two threads (a hyper-parameter sweep): the other thread's first fetch
        # is still running when the main loop's steps end root discovery (seen once in 30
        # runs of two threads under load): its first forward went untimed.
        import threading

        entered, release = threading.Event(), threading.Event()

        class FirstWaits(Dataset):
            def __len__(self):
                return 32

            def __getitem__(self, i):
                if not entered.is_set():
                    entered.set()
                    release.wait(30)  # the GIL is free meanwhile
                return torch.randn(16), torch.randn(1)

        def other():
            m, o = model_and_opt()
            for x, y in DataLoader(FirstWaits(), batch_size=8):
                train_step(m, o, x, y)

        thread = threading.Thread(target=other)
        thread.start()
        entered.wait(30)
        for _ in range(2):  # the main loop: its model found, then steps without a new root
            for x, y in DataLoader(data, batch_size=8):
                train_step(model, opt, x, y)
        release.set()
        thread.join()
    elif kind == "set_up_then_wait":
        # A thread makes its model and optimizer, then waits (for data, for a barrier) while
        # the main loop steps: seen once under load with two loops in two threads, the main
        # loop's quiet steps ended root discovery and the thread's first forward went untimed.
        import threading

        made, release = threading.Event(), threading.Event()

        def other():
            m, o = model_and_opt()
            made.set()
            release.wait(30)
            x, y = torch.randn(8, 16), torch.randn(8, 1)
            for _ in range(4):
                train_step(m, o, x, y)

        thread = threading.Thread(target=other)
        thread.start()
        made.wait(30)
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        for _ in range(6):  # the main loop: its model found, then steps without a new root
            train_step(model, opt, x, y)
        release.set()
        thread.join()
    elif kind == "restarted_loader":
        # FixMatch: the labeled loader drives the loop; a smaller unlabeled one is read with
        # next() and restarted where it runs out (here every 4th iteration: the 8th comes
        # right after the first operator window, steps 5-7, whose closing ran there).
        labeled = DataLoader(data, batch_size=4)  # 12 batches an epoch
        unlabeled = DataLoader(TensorDataset(torch.randn(16, 16)), batch_size=4)  # 4 batches
        u_iter = iter(unlabeled)
        t0 = time.perf_counter_ns()
        for epoch in range(2):
            for x, y in labeled:
                try:
                    (u,) = next(u_iter)
                except StopIteration:
                    u_iter = iter(unlabeled)
                    (u,) = next(u_iter)
                opt.zero_grad()
                (nn.functional.mse_loss(model(x), y) + model(u).pow(2).mean()).backward()
                opt.step()
        print("loop_ns", time.perf_counter_ns() - t0)
    elif kind == "restarted_by_count":
        # the same, restarting the unlabeled loader by a count instead of at StopIteration
        labeled = DataLoader(data, batch_size=4)
        unlabeled = DataLoader(TensorDataset(torch.randn(16, 16)), batch_size=4)
        t0 = time.perf_counter_ns()
        n = 0
        for epoch in range(2):
            for x, y in labeled:
                if n % len(unlabeled) == 0:
                    u_iter = iter(unlabeled)
                (u,) = next(u_iter)
                n += 1
                opt.zero_grad()
                (nn.functional.mse_loss(model(x), y) + model(u).pow(2).mean()).backward()
                opt.step()
        print("loop_ns", time.perf_counter_ns() - t0)
    elif kind == "zip_then_eval":
        # two loaders zipped (domain adaptation): zip ends at the shorter one, the longer
        # one's last batch read and never used; then a validation pass. The train loop
        # ends inside the first operator window (steps 5-7), which closes there.
        source = DataLoader(data, batch_size=6)  # 8 batches
        target = DataLoader(TensorDataset(torch.randn(42, 16)), batch_size=6)  # 7 batches
        for (x, y), (u,) in zip(source, target):
            opt.zero_grad()
            (nn.functional.mse_loss(model(x), y) + model(u).pow(2).mean()).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, y in DataLoader(data, batch_size=12):  # 4 eval steps
                model(x)
    elif kind == "dry_run":
        # a forward on a dummy input sizes the model (the CNN tutorials' flatten size, lazy
        # modules), then the data is set up (a download: slow), then the training loop
        with torch.no_grad():
            n_out = model(torch.zeros(1, 16)).numel()
        time.sleep(0.3)
        for x, y in DataLoader(data, batch_size=8):  # 6 train steps
            train_step(model, opt, x, y)
        print("n_out", n_out)
    elif kind == "train_accuracy":
        # each iteration: a train step, then the model in eval mode on the same batch for
        # the training accuracy (no loader feeds it), then 5 ms of bookkeeping (logging)
        t0 = time.perf_counter_ns()
        for x, y in DataLoader(data, batch_size=8):  # 6 iterations
            model.train()
            train_step(model, opt, x, y)
            model.eval()
            with torch.no_grad():
                model(x)
            time.sleep(0.005)
        print("loop_ns", time.perf_counter_ns() - t0)
    print("done")


if __name__ == "__main__":
    main()
