"""torch.compile jobs for tests/test_compilation.py: python compile_jobs.py KIND.

recompile  a compiled model (aot_eager) whose forward has a data-dependent branch and an
           ``.item()`` (two graph breaks) and whose batch size changes at step 10 (a recompile
           of forward and of the code after the breaks), 30 steps
healthy    the same model without the branch, one batch size: compiled once, 30 steps
limit      a compiled loss scaled by the step number, a Python int (a recompile every step), with
           torch._dynamo.config.recompile_limit 4: from the 5th step on it runs uncompiled, 12 steps
tfretrace  (TensorFlow) a custom loop whose tf.function step takes the learning rate as a Python
           float that decays every step: a new trace each step, 24 steps
tfhealthy  the same loop with the learning rate a tensor: traced once
kerasxla   (Keras on TensorFlow) a fit with jit_compile=True, 2 epochs of 16 steps; also prints
           ``first <ms> median <ms>``, its first batch and its median batch as a callback timed them

Prints ``graphs <n> recompiles <n>`` from dynamo's own counters: the job's compiles,
the same with and without stepscope (kerasxla: its final loss, the same).
"""
import sys

try:
    import torch
    import torch.nn as nn
except ImportError:  # (the TensorFlow jobs)
    torch = nn = None


class Net(nn.Module if nn is not None else object):
    def __init__(self, branch):
        super().__init__()
        self.a, self.b, self.branch = nn.Linear(32, 32), nn.Linear(32, 1), branch

    def forward(self, x):
        h = self.a(x)
        if self.branch and h.sum() > 0:  # data-dependent: a graph break
            h = h * 2
        if self.branch:
            h = h / (1.0 + abs(h.mean().item()))  # a Python number from a tensor: a graph break
        return self.b(h)


def tf_loop(kind):
    import numpy as np
    import tensorflow as tf

    x, y = np.random.rand(768, 32).astype("float32"), np.random.rand(768, 1).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # 24 batches
    w = tf.Variable(tf.random.normal((32, 1)))

    @tf.function
    def step(a, b, lr):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((a @ w - b) ** 2)
        w.assign_sub(lr * tape.gradient(loss, w))

    lr = 0.1
    for a, b in data:
        step(a, b, lr if kind == "tfretrace" else tf.constant(lr))
        lr *= 0.99
    print("graphs", step.experimental_get_tracing_count(), "recompiles", 0)


def keras_xla():
    import os
    import time

    os.environ["KERAS_BACKEND"] = "tensorflow"  # jit_compile here means XLA through TensorFlow
    import keras
    import numpy as np

    class Timer(keras.callbacks.Callback):
        times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.t)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    x, y = np.random.rand(512, 32).astype("float32"), np.random.rand(512, 1).astype("float32")
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[Timer()])
    print("graphs (Keras keeps its tf.function to itself) loss", history.history["loss"][-1])
    print("first", round(Timer.times[0] * 1e3, 3), "median", round(float(np.median(Timer.times)) * 1e3, 3))


def main(kind):
    if kind == "kerasxla":
        return keras_xla()
    if kind.startswith("tf"):
        return tf_loop(kind)
    import torch._dynamo.utils as dynamo_utils

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if kind == "limit":
        return limit_loop(dynamo_utils)
    model = Net(branch=kind == "recompile")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="aot_eager")
    for i in range(30):
        batch = 32 if kind == "healthy" or i < 10 else 48
        opt.zero_grad()
        compiled(torch.randn(batch, 32)).pow(2).mean().backward()
        opt.step()
    metrics = dynamo_utils.get_compilation_metrics()
    print("graphs", dynamo_utils.counters["stats"]["unique_graphs"],
          "recompiles", sum(1 for m in metrics if m.recompile_reason))


def limit_loop(dynamo_utils):
    torch._dynamo.config.recompile_limit = 4
    model = nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="aot_eager", dynamic=False)
    def scaled_loss(out, step):
        return out.pow(2).mean() * (1.0 + 0.01 * step)  # the step, a Python int, guarded: a recompile

    for i in range(12):
        opt.zero_grad()
        scaled_loss(model(torch.randn(16, 32)), i).backward()
        opt.step()
    metrics = dynamo_utils.get_compilation_metrics()
    print("graphs", dynamo_utils.counters["stats"]["unique_graphs"],
          "recompiles", sum(1 for m in metrics if m.recompile_reason and not m.fail_type))


if __name__ == "__main__":
    main(sys.argv[1])
