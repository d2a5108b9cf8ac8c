"""TensorFlow's "training loop from scratch" with the batches in a Python list of tensors
(no tf.data): a tf.function step (no jit_compile) with a GradientTape and
tf.keras.optimizers.Adam, 2 epochs x 6 batches, then the same loop eager with a fresh model
and tf.keras.optimizers.SGD, 6 batches (issue 81). One train step per optimizer step: the
tf.function's call, or the eager step from its GradientTape, its apply_gradients the
Optimizer phase."""
# expect: {"train": 18, "phases": {"train": ["Optimizer"]}, "note": "no tf.data fetch drives"}
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
batches = [(tf.constant(rng.normal(size=(16, 8)).astype("float32")),
            tf.constant(rng.normal(size=(16, 1)).astype("float32"))) for _ in range(6)]


def trainer(optimizer, compiled):
    w1 = tf.Variable(tf.random.normal((8, 16), seed=1) * 0.1)
    w2 = tf.Variable(tf.random.normal((16, 1), seed=2) * 0.1)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2 - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, [w1, w2]), [w1, w2]))
        return loss

    return tf.function(train_step) if compiled else train_step


steps = 0
step = trainer(tf.keras.optimizers.Adam(0.01), compiled=True)
for epoch in range(2):
    for x, y in batches:
        loss = step(x, y)
        steps += 1
    print(f"epoch {epoch} loss {float(loss):.4f}")
step = trainer(tf.keras.optimizers.SGD(0.05), compiled=False)
for x, y in batches:
    loss = step(x, y)
    steps += 1
print(f"eager loss {float(loss):.4f} steps {steps}")
