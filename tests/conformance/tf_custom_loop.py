"""TensorFlow without Keras's fit: a tf.data pipeline and a custom @tf.function
train step with a GradientTape, iterated from Python (2 epochs x 4 batches).
Forward/Backward/Optimizer run inside one compiled call: what is not measured
must be said in run.json."""
# expect: {"train": 8, "phases": {"train": ["GetNext"]}, "every": {"train": ["GetNext"]},
# expect:  "note": "tf.function"}
import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1).batch(16)
w1 = tf.Variable(tf.random.normal((8, 16), seed=1) * 0.1)
w2 = tf.Variable(tf.random.normal((16, 1), seed=2) * 0.1)
opt = tf.optimizers.SGD(0.05)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        pred = tf.nn.relu(xb @ w1) @ w2
        loss = tf.reduce_mean(tf.square(pred - yb))
    grads = tape.gradient(loss, [w1, w2])
    opt.apply_gradients(zip(grads, [w1, w2]))
    return loss


for epoch in range(2):
    for xb, yb in ds:
        loss = train_step(xb, yb)
    print(f"epoch {epoch} loss {float(loss):.4f}")
