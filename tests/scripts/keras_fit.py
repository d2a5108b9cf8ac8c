"""Keras 3 (TF backend by default): python keras_fit.py [callback|plain] [jit|nojit] [tensorboard LOGDIR|unknown]

fit on numpy arrays with validation (2 epochs x 10 batches, 2 validation
batches per epoch), fit on a tf.data.Dataset (8 batches), evaluate (4
batches) and predict (3 batches).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    callbacks = []
    jit = len(sys.argv) > 2 and sys.argv[2] == "jit"
    extra = sys.argv[3] if len(sys.argv) > 3 else None
    if extra == "tensorboard":  # the user's own profiler over batches 3..6 of the first fit
        callbacks.append(keras.callbacks.TensorBoard(log_dir=sys.argv[4], profile_batch=(3, 6)))
    if extra == "unknown":  # a Keras stepscope does not know
        keras.__version__ = "9.0.0"
    if sys.argv[1] == "callback":
        from stepscope.integrations.keras import StepscopeCallback

        callbacks.append(StepscopeCallback())
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit)
    x = np.random.rand(320, 32).astype("float32")
    y = np.random.rand(320, 1).astype("float32")
    model.fit(x, y, batch_size=32, epochs=2, validation_data=(x[:64], y[:64]), callbacks=callbacks, verbose=0)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(32)
        model.fit(ds, epochs=1, callbacks=callbacks, verbose=0)
        model.evaluate(ds.take(4), callbacks=callbacks, verbose=0)
    else:
        model.fit(x[:256], y[:256], batch_size=32, epochs=1, callbacks=callbacks, verbose=0)
        model.evaluate(x[:128], y[:128], batch_size=32, callbacks=callbacks, verbose=0)
    out = model.predict(x[:96], batch_size=32, callbacks=callbacks, verbose=0)
    print("done", out.shape, "checksum %.4f" % float(np.abs(out).sum()))
