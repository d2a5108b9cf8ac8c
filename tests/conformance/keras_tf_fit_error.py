"""Keras 3 (TensorFlow backend): errors inside fit keep their traceback (issue 47).
A fit with labels of the wrong shape fails while its step is traced (the script
prints the traceback and goes on); a second fit's callback raises at train batch 6
of 12, while a sampled profiler window is open, and the job dies of it. stderr,
tracebacks included, is the plain run's byte for byte."""
# expect: {"train": 6, "interrupted": 1, "exit": 1, "same_stderr": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]}}
import os
import traceback

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np


class StopAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            raise RuntimeError(f"stopped on purpose after batch {batch}")


keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 8)).astype("float32")
y = rng.integers(0, 3, size=(96,)).astype("int64")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
try:
    model.fit(x, np.stack([y] * 5, axis=1), batch_size=8, epochs=1, verbose=0)  # labels of the wrong shape
except ValueError:
    traceback.print_exc()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
print("fitting")
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[StopAtBatch()])
