"""Keras 3 (TensorFlow backend): fit (1 epoch x 4 batches), evaluate (3 batches),
predict (2 batches). The Forward of evaluate/predict steps is not measured on the
TensorFlow backend (profiler windows sample fit only): run.json must say so."""
# expect: {"train": 4, "eval": 3, "predict": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext"], "predict": ["GetNext"]},
# expect:  "note": "Keras evaluate/predict",
# expect:  "optional": {"eval": ["Loss"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"], "predict": ["GetNext"]}}
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
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=16, epochs=1, callbacks=callbacks, verbose=0)
loss = model.evaluate(x[:48], y[:48], batch_size=16, callbacks=callbacks, verbose=0)
pred = model.predict(x[:32], batch_size=16, callbacks=callbacks, verbose=0)
print(f"loss {loss:.4f} predictions {pred.shape} {float(pred.sum()):.4f}")
