"""Keras 3 (TensorFlow backend) with compile(steps_per_execution=4): 2 epochs x 8
batches; a train step is an optimizer step (16 = optimizer.iterations), not one
execution of 4."""
# expect: {"train": 16, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "note": "steps_per_execution > 1: the batches are fetched inside the compiled loop; GetNext is sampled"}
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

x, y = rng.normal(size=(128, 8)).astype("float32"), rng.normal(size=(128, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=4)
history = model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} iterations {int(model.optimizer.iterations.numpy())}")
