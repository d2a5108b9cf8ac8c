"""Keras 3 (TensorFlow backend) fit on a tf.data pipeline (from_tensor_slices, map,
shuffle, batch, prefetch): 2 epochs x 6 batches, validation on a second pipeline
(2 batches per epoch)."""
# expect: {"train": 12, "eval": 4, "callback": true,
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
import tensorflow as tf  # noqa: E402

x, y = rng.normal(size=(96, 8)).astype("float32"), rng.integers(0, 3, size=(96,))


def augment(features, label):
    return features * 0.5 + 0.1, label


train = (tf.data.Dataset.from_tensor_slices((x, y)).map(augment).shuffle(96, seed=1)
         .batch(16).prefetch(tf.data.AUTOTUNE))
val = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(16)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(train, epochs=2, validation_data=val, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} val_accuracy {history.history['val_accuracy'][-1]:.4f}")
