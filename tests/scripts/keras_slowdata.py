"""Keras 3 fit on the TensorFlow backend, fed by a slow tf.data pipeline (a sequential
map that takes 1 ms a sample, no prefetch): python keras_slowdata.py [callback|plain]"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf


def decode(x, y):
    def slow(v):
        time.sleep(0.001)  # decoding an image
        return v

    x = tf.py_function(slow, [x], tf.float32)
    x.set_shape((32,))
    return x, y


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    callbacks = []
    if sys.argv[1] == "callback":
        from stepscope.integrations.keras import StepscopeCallback

        callbacks.append(StepscopeCallback())
    x = np.random.rand(16 * 12, 32).astype("float32")
    y = np.random.rand(16 * 12, 1).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(decode).batch(16)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ds, epochs=2, callbacks=callbacks, verbose=0)
    print("done", keras.backend.backend())
