"""Keras 3 on the torch backend (KERAS_BACKEND=torch set by the script): fit with
validation_data (2 epochs x 5 batches, 2 validation batches per epoch), then predict
(2 batches)."""
# expect: {"train": 10, "eval": 4, "predict": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"], "predict": ["GetNext", "Forward"]},
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"], "predict": ["Forward"]}}
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np

assert keras.backend.backend() == "torch"
keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
rng = np.random.default_rng(0)
x, y = rng.normal(size=(80, 8)).astype("float32"), rng.normal(size=(80, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=2, validation_data=(x[:32], y[:32]), callbacks=callbacks, verbose=0)
pred = model.predict(x[:32], batch_size=16, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} val_loss {history.history['val_loss'][-1]:.4f}")
print(f"predictions {pred.shape} {float(pred.sum()):.4f}")
