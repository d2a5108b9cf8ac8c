"""A TensorFlow loop of its own: a tf.function step fed NumPy slices by hand (no tf.data,
no Keras fit) that updates its variables by hand (no optimizer), 2 epochs x 6 batches.
stepscope sees no step in it: nothing tells where its iterations begin."""
import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(96, 8)).astype("float32"), rng.normal(size=(96, 1)).astype("float32")
w, b = tf.Variable(tf.zeros((8, 1))), tf.Variable(tf.zeros((1,)))


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((xb @ w + b - yb) ** 2)
    for v, g in zip([w, b], tape.gradient(loss, [w, b])):
        v.assign_sub(0.05 * g)
    return loss


for epoch in range(2):
    for i in range(0, 96, 16):
        loss = train_step(x[i:i + 16], y[i:i + 16])
    print(epoch, f"{float(loss):.4f}")
