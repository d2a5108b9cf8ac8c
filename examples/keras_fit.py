"""Profile a Keras 3 `fit` with the callback, print the steps and sampled phase shares.

    python3 examples/keras_fit.py [--epochs N] [--jit]
    STEPSCOPE=1 python3 examples/keras_fit.py --plain     # the same, with no callback in the code

A small MLP on synthetic data from a tf.data pipeline, compiled train step
(TensorFlow backend). Every step gets GetNext; a few sampled steps per epoch
get Forward/Loss/Backward/Optimizer from a short tf.profiler window.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import stepscope
from stepscope.core.vocabulary import PHASES
from stepscope.integrations.keras import StepscopeCallback


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--jit", action="store_true", help="jit_compile=True (XLA)")
    parser.add_argument("--plain", action="store_true", help="no callback: run it under STEPSCOPE=1")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    x = np.random.rand(8192, 32).astype("float32")
    y = (x @ np.random.rand(32, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192).batch(32).prefetch(2)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=args.jit)

    callbacks = [] if args.plain else [StepscopeCallback()]
    model.fit(data, epochs=args.epochs, validation_data=data.take(16), callbacks=callbacks, verbose=2)
    model.predict(x[:1024], batch_size=256, callbacks=callbacks, verbose=0)

    session = stepscope.current()
    if session is None:
        return
    session.stop()
    run = stepscope.load(session.path, quiet=True)
    steps = run.steps
    for mode, group in steps.groupby("mode", observed=True):
        print(f"{mode:8s} {len(group):4d} steps, median {group['duration_ns'].median() / 1e6:.2f} ms")
    train = steps[steps["mode"] == "train"]
    sampled = train[train["Forward"] > 0]
    shares = sampled[list(PHASES)].sum() / sampled["duration_ns"].sum()
    print(f"phase shares over the {len(sampled)} sampled train steps:")
    print("  " + "  ".join(f"{p} {shares[p]:.2%}" for p in PHASES))
    print(f"run folder: {session.path}  (stepscope report {session.path})")


if __name__ == "__main__":
    main()
