"""TensorFlow's "custom training loop with tf.distribute.Strategy" recipe:
MirroredStrategy (one CPU device here), experimental_distribute_dataset,
strategy.run inside a tf.function step, iterated from Python (3 epochs x 4
batches). Each fetch from the strategy's iterator begins a step."""
# expect: {"train": 12, "phases": {"train": ["GetNext"]}, "every": {"train": ["GetNext"]},
# expect:  "note": "tf.function"}
import numpy as np
import tensorflow as tf

tf.random.set_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1).batch(16))
with strategy.scope():
    w1 = tf.Variable(tf.random.normal((8, 16), seed=1) * 0.1)
    w2 = tf.Variable(tf.random.normal((16, 1), seed=2) * 0.1)
    opt = tf.optimizers.SGD(0.05)


def train_step(batch):
    xb, yb = batch
    with tf.GradientTape() as tape:
        pred = tf.nn.relu(xb @ w1) @ w2
        loss = tf.nn.compute_average_loss(tf.reduce_mean(tf.square(pred - yb), axis=1), global_batch_size=16)
    grads = tape.gradient(loss, [w1, w2])
    opt.apply_gradients(zip(grads, [w1, w2]))
    return loss


@tf.function
def distributed_step(batch):
    per_replica = strategy.run(train_step, args=(batch,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


for epoch in range(3):
    total, batches = 0.0, 0
    for batch in dataset:
        total += float(distributed_step(batch))
        batches += 1
    print(f"epoch {epoch} batches {batches} loss {total / batches:.4f}")
