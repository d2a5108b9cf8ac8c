"""Whole-run overhead of the Keras callback (and of the Lightning callback).

    python3 bench/keras_overhead.py [--rounds 15] [--lightning | --lightning-only]

Same method as bench/overhead.py: configurations run in one process,
interleaved round by round; each figure is the median over rounds of a
configuration's time divided by the no-profiler time of the same round (the
VM's speed drifts by ±20% over seconds; pairing cancels that).

* Keras 3, TensorFlow backend: ``model.fit`` of a small MLP (32-64-64-1,
  Adam, batch 32) for 3 epochs of 200 steps on numpy arrays, compiled step,
  ``jit_compile`` off and on; with ``StepscopeCallback()`` and a running session
  (steps, a Python-side fetch timed as GetNext on every step, and the sampled
  profiler windows with their export and parsing) vs no callback, and the
  callback with no window (``STEPSCOPE_STEPS`` out of reach). The whole ``fit``
  is timed; the model is traced before the first round. TensorFlow runs one
  intra-op and one inter-op thread (the VM has 2 cores shared with others).
* ``--lightning``: ``Trainer.fit`` of an MLP at ~1 ms steps (2 epochs of 200
  batches), with ``StepscopeCallback()`` vs without.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def paired(configs: dict, rounds: int) -> dict:
    """Median over rounds of each configuration's time over the first one's, same
    round; and the ratio of the configurations' fastest rounds (other jobs on a
    shared VM only ever add time, so the fastest round is the least disturbed)."""
    for run in configs.values():
        run()  # warm up: tracing, compilation, stepscope's first window
    names = list(configs)
    ratios = {n: [] for n in names[1:]}
    best = {n: float("inf") for n in names}
    base = []
    for _ in range(rounds):
        times = {}
        for name in names:
            t = time.perf_counter()
            configs[name]()
            times[name] = time.perf_counter() - t
            best[name] = min(best[name], times[name])
        base.append(times[names[0]])
        for n in names[1:]:
            ratios[n].append(times[n] / times[names[0]])
    return {"base_s": statistics.median(base), **{n: statistics.median(v) for n, v in ratios.items()},
            **{f"{n} (best)": best[n] / best[names[0]] for n in names[1:]}}


def cell(m: dict, name: str) -> str:
    return f"{m[name]:.3f}x (best {m[name + ' (best)']:.3f}x)"


def keras_configs(jit: bool, tmp: str) -> dict:
    import keras
    import numpy as np

    import stepscope
    from stepscope.integrations import keras as st_keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit)
    x = np.random.rand(6400, 32).astype("float32")
    y = np.random.rand(6400, 1).astype("float32")

    def fit(callbacks):
        model.fit(x, y, batch_size=32, epochs=3, callbacks=callbacks, verbose=0)

    def with_stepscope(**start):
        run = stepscope.start(dir=tmp, name=f"keras-{time.time_ns()}", **start)
        try:
            fit([st_keras.StepscopeCallback()])
        finally:
            run.stop()
            st_keras.uninstrument()

    return {"none": lambda: fit([]), "stepscope": with_stepscope,
            "no windows": lambda: with_stepscope(steps="1000000000-1000000000")}


def lightning_configs(tmp: str) -> dict:
    import lightning as L
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import stepscope
    from stepscope.integrations import torch as st_torch
    from stepscope.integrations.lightning import StepscopeCallback

    torch.set_num_threads(1)

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 1))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(200 * 64, 64), torch.randn(200 * 64, 1)), batch_size=64)

    def fit(callbacks):
        torch.manual_seed(0)
        trainer = L.Trainer(max_epochs=2, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                            enable_model_summary=False, callbacks=callbacks, accelerator="cpu")
        trainer.fit(Model(), data)

    def with_stepscope():
        run = stepscope.start(dir=tmp, name=f"lightning-{time.time_ns()}")
        try:
            fit([StepscopeCallback()])
        finally:
            run.stop()
            st_torch.uninstrument()

    return {"none": lambda: fit([]), "stepscope": with_stepscope}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--lightning", action="store_true", help="also Lightning at ~1 ms steps")
    parser.add_argument("--lightning-only", action="store_true", help="only Lightning (no TensorFlow import)")
    args = parser.parse_args()
    if args.lightning_only:
        with tempfile.TemporaryDirectory() as tmp:
            m = paired(lightning_configs(tmp), args.rounds)
        print("| job | whole run (no profiler) | step | stepscope |\n| --- | ---: | ---: | ---: |")
        print(f"| Lightning fit, MLP, 2 x 200 steps | {m['base_s']:.2f} s | {m['base_s'] / 400 * 1e3:.2f} ms "
              f"| {cell(m, 'stepscope')} |")
        return
    import keras
    import tensorflow as tf

    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, median of {args.rounds} interleaved rounds")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    print("| job | whole run (no profiler) | step | stepscope | stepscope without windows |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for jit in (False, True):
            m = paired(keras_configs(jit, tmp), args.rounds)
            print(f"| Keras fit, MLP, 3 x 200 steps, jit_compile={jit} | {m['base_s']:.2f} s "
                  f"| {m['base_s'] / 600 * 1e3:.2f} ms | {cell(m, 'stepscope')} | {cell(m, 'no windows')} |",
                  flush=True)
        if args.lightning:
            m = paired(lightning_configs(tmp), args.rounds)
            print(f"| Lightning fit, MLP, 2 x 200 steps | {m['base_s']:.2f} s | {m['base_s'] / 400 * 1e3:.2f} ms "
                  f"| {cell(m, 'stepscope')} | |", flush=True)


if __name__ == "__main__":
    main()
