"""TensorFlow's "training loop from scratch" pattern, eager: a train step
with a GradientTape, and after each epoch a validation loop over another
dataset calling an eager test step (no gradient, no tf.function: the second
dataset after the training one ran out) (2 epochs x 6 train batches, 3
validation batches each). The validation batches are eval steps (issue 47); the eager
apply_gradients is each train step's Optimizer phase (issue 81)."""
# expect: {"train": 12, "eval": 6, "phases": {"train": ["GetNext", "Optimizer"], "eval": ["GetNext"]},
# expect:  "every": {"train": ["GetNext", "Optimizer"], "eval": ["GetNext"]}, "note": "tf.data"}
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(96, 8)).astype("float32"), rng.normal(size=(96, 1)).astype("float32")
xv, yv = rng.normal(size=(48, 8)).astype("float32"), rng.normal(size=(48, 1)).astype("float32")
train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
val_dataset = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(16)
w = tf.Variable(tf.random.normal((8, 1), seed=1))
optimizer = tf.keras.optimizers.SGD(0.05)


def loss_of(xb, yb):
    return tf.reduce_mean(tf.square(xb @ w - yb))



def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_of(xb, yb)
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    return loss



def test_step(xb, yb):
    return loss_of(xb, yb)


for epoch in range(2):
    for xb, yb in train_dataset:
        loss = train_step(xb, yb)
    val = [float(test_step(xb, yb)) for xb, yb in val_dataset]
    print(f"epoch {epoch} loss {float(loss):.4f} val {np.mean(val):.4f}")
