"""Profile a small training loop, print what stepscope recorded, write the HTML report.

    python3 examples/quickstart.py [--steps N]

A two-layer network trained with numpy on synthetic data, with a data
loader that takes a little time per batch (as real input pipelines do).
Phases are marked by hand here; the framework integrations mark them for
you (stepscope.integrations.torch, .lightning, .keras).
"""

import argparse
import time

import numpy as np

import stepscope


def batches(n, batch_size=256, features=64, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=(features, 1))
    for _ in range(n):
        time.sleep(0.002)  # reading and decoding a batch
        x = rng.normal(size=(batch_size, features))
        yield x, x @ w_true + 0.1 * rng.normal(size=(batch_size, 1))


def train(steps):
    rng = np.random.default_rng(1)
    w1 = rng.normal(scale=0.1, size=(64, 256))
    w2 = rng.normal(scale=0.1, size=(256, 1))
    lr = 1e-3
    data = batches(steps)
    for _ in range(steps):
        stepscope.step()
        with stepscope.phase("GetNext"):
            x, y = next(data)
        with stepscope.phase("Forward"):
            h = np.maximum(x @ w1, 0)
            pred = h @ w2
        with stepscope.phase("Loss"):
            err = pred - y
            loss = float((err ** 2).mean())
        with stepscope.phase("Backward"):
            g_pred = 2 * err / len(x)
            g_w2 = h.T @ g_pred
            g_h = (g_pred @ w2.T) * (h > 0)
            g_w1 = x.T @ g_h
        with stepscope.phase("Optimizer"):
            w1 -= lr * g_w1
            w2 -= lr * g_w2
        stepscope.counter("loss", loss)
    stepscope.end_step()
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where runs go (default: STEPSCOPE_DIR or ./stepscope-runs)")
    args = parser.parse_args()
    with stepscope.profile(dir=args.dir) as run:
        loss = train(args.steps)
    print(f"final loss {loss:.4f}")
    result = stepscope.load(run.path, quiet=True)
    print(result.summary_text())
    report = result.report()
    print(f"run folder: {run.path}")
    print(f"report:     {report}  (open it in a browser; it works offline)")


if __name__ == "__main__":
    main()
