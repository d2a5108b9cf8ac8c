"""Custom TensorFlow loops over a tf.data.Dataset: python tfdata_loops.py [api|plain]

An eager loop (12 batches, `for batch in ds`, eager GradientTape step), then
a loop calling a tf.function step (10 batches, `next(it)` until the end).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

if __name__ == "__main__":
    if sys.argv[1] == "api":
        import stepscope
        from stepscope.integrations import tfdata

        stepscope.start()
        tfdata.instrument()
    tf.random.set_seed(0)
    w = tf.Variable(tf.random.normal((32, 1)))
    optimizer = tf.keras.optimizers.SGD(0.01)
    data = tf.data.Dataset.from_tensor_slices((tf.random.normal((384, 32)), tf.random.normal((384, 1))))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x @ w - y))
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    for x, y in data.batch(32):  # eager loop: 12 batches
        step(x, y)

    compiled = tf.function(step)
    it = iter(data.take(320).batch(32))  # tf.function step: 10 batches
    while True:
        try:
            x, y = next(it)
        except StopIteration:
            break
        compiled(x, y)
    print("done")
