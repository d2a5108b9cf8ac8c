"""Profile a custom TensorFlow training loop over a tf.data.Dataset.

    STEPSCOPE=1 python3 examples/tfdata_loop.py

No stepscope code in the loop: under STEPSCOPE=1 every eager fetch from the
dataset is timed as GetNext and begins a train step; the step itself is a
`tf.function`. The input pipeline does some work per batch (a map with a
little math), so GetNext is visible. Without STEPSCOPE=1 the script starts a
session itself.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import stepscope


def main():
    session = stepscope.current()
    if session is None:  # not under STEPSCOPE=1: the Python API
        from stepscope.integrations import tfdata

        session = stepscope.start()
        tfdata.instrument()

    tf.random.set_seed(0)
    features = tf.random.normal((16384, 64))
    targets = tf.reduce_sum(features, axis=1, keepdims=True)
    data = (tf.data.Dataset.from_tensor_slices((features, targets))
            .map(lambda x, y: (tf.math.tanh(x) + tf.math.sin(x), y))
            .batch(64))
    w1 = tf.Variable(tf.random.normal((64, 128), stddev=0.1))
    w2 = tf.Variable(tf.random.normal((128, 1), stddev=0.1))
    optimizer = tf.keras.optimizers.Adam(1e-3)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2 - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, [w1, w2]), [w1, w2]))
        return loss

    for epoch in range(2):
        for x, y in data:
            loss = train_step(x, y)
        print(f"epoch {epoch}: loss {float(loss):.4f}")

    session.stop()
    steps = stepscope.load(session.path, quiet=True).steps
    print(f"{len(steps)} train steps, median {steps['duration_ns'].median() / 1e6:.2f} ms, "
          f"GetNext share {steps['GetNext'].sum() / steps['duration_ns'].sum():.1%}")
    print(f"run folder: {session.path}")


if __name__ == "__main__":
    main()
