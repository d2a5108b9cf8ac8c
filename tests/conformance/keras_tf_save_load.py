"""Keras 3 (TensorFlow backend): fit, model.save("m.keras"), keras.saving.load_model
and evaluate the reloaded model (the harness also loads m.keras in a clean process):
2 epochs x 4 batches, then 2 evaluation batches."""
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

x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
inputs = keras.Input((8,))
outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs))
model = keras.Model(inputs, outputs)
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
model.save("m.keras")
again = keras.saving.load_model("m.keras")
print(f"reloaded loss {again.evaluate(x[:32], y[:32], batch_size=16, callbacks=callbacks, verbose=0):.4f}")
