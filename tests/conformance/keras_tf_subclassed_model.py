"""Keras 3 (TensorFlow backend): a subclassed keras.Model with its own call() and a
dropout layer, fit (2 epochs x 4 batches) then evaluate (2 batches)."""
# expect: {"train": 8, "eval": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"]}}
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np

keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
rng = np.random.default_rng(0)


class Regressor(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.dropout = keras.layers.Dropout(0.1)
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.dropout(self.hidden(x), training=training))


x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
model = Regressor()
model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse", metrics=["mae"])
model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
loss, mae = model.evaluate(x[:32], y[:32], batch_size=16, callbacks=callbacks, verbose=0)
print(f"loss {loss:.4f} mae {mae:.4f}")
