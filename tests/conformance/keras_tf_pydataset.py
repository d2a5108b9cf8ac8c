"""Keras 3 (TensorFlow backend) fed by a keras.utils.PyDataset (the Sequence
successor: batches built in Python, shuffled at each epoch end): 2 epochs x 5 batches,
validation on a second PyDataset (2 batches per epoch)."""
# expect: {"train": 10, "eval": 4, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"]}}
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np


class Batches(keras.utils.PyDataset):
    def __init__(self, n, seed, **kwargs):
        super().__init__(**kwargs)
        rng = np.random.default_rng(seed)
        self.x, self.y = rng.normal(size=(n, 8)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")
        self.order = np.arange(n)
        self.rng = rng

    def __len__(self):
        return len(self.x) // 16

    def __getitem__(self, i):
        idx = self.order[i * 16:(i + 1) * 16]
        return self.x[idx] * 0.5, self.y[idx]

    def on_epoch_end(self):
        self.rng.shuffle(self.order)


keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
history = model.fit(Batches(80, 1), epochs=2, validation_data=Batches(32, 2), callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} val_loss {history.history['val_loss'][-1]:.4f}")
