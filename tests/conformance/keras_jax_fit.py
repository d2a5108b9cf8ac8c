"""Keras 3 on the JAX backend (KERAS_BACKEND=jax set by the script): fit with
validation_data (2 epochs x 5 batches, 2 validation batches per epoch), then predict
(2 batches). JAX gives steps and GetNext; the compute phases inside the jitted step are
not measured, and a note says so."""
# expect: {"train": 10, "eval": 4, "predict": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext"], "eval": ["GetNext"], "predict": ["GetNext"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"], "predict": ["GetNext"]},
# expect:  "note": "Keras on JAX"}
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras
import numpy as np

assert keras.backend.backend() == "jax"
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
