"""Keras 3 (TensorFlow backend) with the user's own callback that stops training
mid-epoch (after batch 2 of epoch 1): 5 + 3 = 8 train steps of the 15 planned."""
# expect: {"train": 8, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext"]}}
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


class StopMidEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 2:
            self.model.stop_training = True


x, y = rng.normal(size=(80, 8)).astype("float32"), rng.normal(size=(80, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=3, callbacks=[StopMidEpoch(), *callbacks], verbose=0)
print(f"epochs {len(history.history['loss'])} iterations {int(model.optimizer.iterations.numpy())}")
