"""Keras 3 on the torch backend: python keras_torch.py [callback|plain]

model.fit (2 epochs x 10 batches, 2 validation batches per epoch), then a
custom torch-style loop over the same Keras model (12 batches from a torch
DataLoader, a torch loss, loss.backward(), the Keras optimizer's apply).
"""
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    assert keras.backend.backend() == "torch"
    keras.utils.set_random_seed(0)
    callbacks = []
    if sys.argv[1] == "callback":
        from stepscope.integrations.keras import StepscopeCallback

        callbacks.append(StepscopeCallback())
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.rand(320, 32).astype("float32")
    y = np.random.rand(320, 1).astype("float32")
    model.fit(x, y, batch_size=32, epochs=2, validation_data=(x[:64], y[:64]), callbacks=callbacks, verbose=0)

    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    loader = DataLoader(TensorDataset(torch.from_numpy(x[:192]), torch.from_numpy(y[:192])), batch_size=16)
    model.train()  # fit leaves the torch module in eval mode
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        model.zero_grad()
        loss.backward()
        optimizer.apply([v.value.grad for v in model.trainable_variables], model.trainable_variables)
    out = model.predict(x[:96], batch_size=32, callbacks=callbacks, verbose=0)
    print("done", out.shape)
