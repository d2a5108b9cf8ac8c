"""Keras 3 (TensorFlow backend) fit on a torch DataLoader, as Keras 3's multi-framework
guide shows: 2 epochs x 6 batches, a validation DataLoader (2 batches per epoch), then
predict on it (2 batches). Keras reads a DataLoader through tf.data and first peeks at
its batches for their shapes: those reads are no steps."""
# expect: {"train": 12, "eval": 4, "predict": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext"], "predict": ["GetNext"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"], "predict": ["GetNext"]},
# expect:  "note": "Keras evaluate/predict on TensorFlow"}
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

assert keras.backend.backend() == "tensorflow"
keras.utils.set_random_seed(0)
torch.manual_seed(0)
torch.set_num_threads(1)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
rng = np.random.default_rng(0)
x, y = rng.normal(size=(96, 8)).astype("float32"), rng.integers(0, 3, 96)
train = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=16)
val = DataLoader(TensorDataset(torch.from_numpy(x[:32]), torch.from_numpy(y[:32])), batch_size=16)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(train, validation_data=val, epochs=2, callbacks=callbacks, verbose=0)
pred = model.predict(val, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} val_loss {history.history['val_loss'][-1]:.4f}")
print(f"predictions {pred.shape} {float(pred.sum()):.4f}")
