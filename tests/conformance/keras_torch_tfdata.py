"""Keras 3 on the torch backend fed by a tf.data pipeline (the backend-agnostic
input recipe): 2 epochs x 4 batches."""
# expect: {"train": 8, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"]}}
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import tensorflow as tf

assert keras.backend.backend() == "torch"
keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 2, size=(64, 1)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3).batch(16)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(ds, epochs=2, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} accuracy {history.history['accuracy'][-1]:.4f}")
