"""TensorFlow custom loops of every shape issue 81 names, one after another in one process:
the train step eager, a tf.function or a tf.function(jit_compile=True); the optimizer a Keras 3
one (``keras.optimizers``), ``tf.keras.optimizers`` or ``tf.compat.v1.train``; the batches from a
Python generator, a list of tensors or a tf.data dataset.

    python tf_unfed_loops.py keras|v1

Each loop prints ``loop <shape> steps <n>`` from its own counter, and its last loss."""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
X, Y = rng.normal(size=(128, 16)).astype("float32"), rng.normal(size=(128, 1)).astype("float32")
BATCH = 16


def generator():
    for i in range(0, len(X), BATCH):
        yield X[i:i + BATCH], Y[i:i + BATCH]


def batches(data):
    if data == "generator":
        return generator()
    if data == "list":
        return [(tf.constant(x), tf.constant(y)) for x, y in generator()]
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)


def loop(kind, optimizer, data, epochs=1):
    w1 = tf.Variable(tf.random.normal((16, 32), seed=1) * 0.1)
    w2 = tf.Variable(tf.random.normal((32, 1), seed=2) * 0.1)
    params = [w1, w2]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2 - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    if kind != "eager":
        step = tf.function(step, jit_compile=kind == "jit")
    n = 0
    for _ in range(epochs):
        for x, y in batches(data):
            loss = step(x, y)
            n += 1
    print(f"loop {kind}-{type(optimizer).__name__}-{data} steps {n} loss {float(loss):.4f}")


if sys.argv[1] == "keras":
    loop("jit", keras.optimizers.SGD(0.05), "generator", epochs=2)
    loop("function", tf.keras.optimizers.Adam(0.01), "list")
    loop("eager", keras.optimizers.SGD(0.05), "list")
    loop("jit", keras.optimizers.SGD(0.05), "tfdata")
else:
    loop("eager", tf.compat.v1.train.GradientDescentOptimizer(0.05), "generator")
    loop("function", tf.compat.v1.train.GradientDescentOptimizer(0.05), "list")
