"""Keras 3 (TensorFlow backend) driven by hand: a Python loop of train_on_batch over
NumPy batches (GAN and RL code does this), then test_on_batch; no fit, so no callbacks.
12 train steps, 2 eval batches."""
# expect: {"train": 12, "eval": 2, "phases": {"train": []}, "note": "train_on_batch on TensorFlow"}
import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(96, 8)).astype("float32"), rng.normal(size=(96, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
for step in range(12):
    loss = model.train_on_batch(x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8])
print(f"loss {float(loss):.4f} iterations {int(model.optimizer.iterations.numpy())}")
for i in range(2):
    print(f"test {float(model.test_on_batch(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])):.4f}")
