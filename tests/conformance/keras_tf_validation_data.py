"""Keras 3 (TensorFlow backend) fit on NumPy arrays with validation_data:
2 epochs x 5 batches, 2 validation batches per epoch."""
# expect: {"train": 10, "eval": 4, "callback": true,
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
x, y = rng.normal(size=(80, 8)).astype("float32"), rng.normal(size=(80, 1)).astype("float32")
xv, yv = rng.normal(size=(32, 8)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=2, validation_data=(xv, yv), callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} val_loss {history.history['val_loss'][-1]:.4f}")
print("iterations", int(model.optimizer.iterations.numpy()))
