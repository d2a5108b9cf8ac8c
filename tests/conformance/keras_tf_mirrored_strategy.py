"""Keras 3 (TensorFlow backend) under tf.distribute.MirroredStrategy (one CPU
device here; the multi-GPU recipe of keras.io), fed by a Python generator with
steps_per_epoch and validation_steps: 3 epochs x 6 train batches, 2 validation
batches each, then predict in 2 batches. The strategy's iterator fetches inside
the compiled step, so GetNext comes from the sampled profiler windows."""
# expect: {"train": 18, "eval": 6, "predict": 2, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "note": "tf.distribute strategy"}
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())


def batches(seed):
    # the same batch every time: the strategy's iterator reads ahead by a number of
    # batches that varies from run to run, and the outputs must not
    x = np.random.default_rng(seed).random((16, 10), dtype=np.float32)
    y = (x.sum(1, keepdims=True) > 5).astype("float32")
    while True:
        yield x, y


strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
with strategy.scope():
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(batches(0), steps_per_epoch=6, epochs=3, validation_data=batches(1), validation_steps=2,
                    callbacks=callbacks, verbose=0)
print("loss", [round(v, 4) for v in history.history["loss"]])
predictions = model.predict(np.ones((40, 10), "float32"), batch_size=20, callbacks=callbacks, verbose=0)
print("predicted", round(float(predictions.sum()), 3))
