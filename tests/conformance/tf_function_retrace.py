"""A custom TensorFlow loop whose tf.function step takes the learning rate as a Python
float that decays (a new trace every step), and an evaluation step traced once. The
traces stepscope records per function must equal TensorFlow's own tracing counts."""
# expect: {"train": 12, "eval": 4, "phases": {"train": ["GetNext"], "eval": ["GetNext"]},
# expect:  "every": {"train": ["GetNext"], "eval": ["GetNext"]}, "note": "tf.function",
# expect:  "compilation": ["tf_functions"]}
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
x, y = np.random.RandomState(0).rand(96, 8).astype("float32"), np.random.RandomState(1).rand(96, 1).astype("float32")
train = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 12 batches
val = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(8)  # 4 batches
w = tf.Variable(tf.zeros((8, 1)))


@tf.function
def train_step(a, b, lr):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((a @ w - b) ** 2)
    w.assign_sub(lr * tape.gradient(loss, w))
    return loss


@tf.function
def eval_step(a, b):
    return tf.reduce_mean((a @ w - b) ** 2)


lr = 0.1
for a, b in train:
    loss = train_step(a, b, lr)
    lr *= 0.95
print(f"train loss {float(loss):.4f}")
for a, b in val:
    loss = eval_step(a, b)
print(f"val loss {float(loss):.4f}")
print("compilation", json.dumps({"tf_functions": {f.__name__: f.experimental_get_tracing_count()
                                                  for f in (train_step, eval_step)}}))
