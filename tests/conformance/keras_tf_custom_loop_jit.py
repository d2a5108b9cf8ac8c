"""Keras 3's own "custom TF workflow" shape: a model of custom layers, a train step under
@tf.function(jit_compile=True) with a GradientTape and a Keras optimizer's apply_gradients,
fed NumPy batches by a Python generator (no tf.data, no fit), 20 steps (issue 81). Each call
of the step function that applies the gradients is a train step; its phases, compiled by
XLA, are not measured, and run.json says so."""
# expect: {"train": 20, "phases": {"train": []}, "note": "no tf.data fetch drives"}
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from keras import Model, initializers, layers, ops, optimizers

tf.random.set_seed(0)
rng = np.random.default_rng(0)


class MyDense(layers.Layer):
    def __init__(self, units, name=None):
        super().__init__(name=name)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer=initializers.GlorotNormal(seed=1),
                                 name="kernel", trainable=True)
        self.b = self.add_weight(shape=(self.units,), initializer=initializers.Zeros(), name="bias", trainable=True)

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b


class MyModel(Model):
    def __init__(self, hidden_dim, output_dim):
        super().__init__()
        self.dense1 = MyDense(hidden_dim)
        self.dense2 = MyDense(output_dim)

    def call(self, x):
        return self.dense2(tf.nn.relu(self.dense1(x)))


def dataset():
    for _ in range(20):
        yield rng.random((32, 64)).astype("float32"), rng.random((32, 4)).astype("float32")


model = MyModel(hidden_dim=64, output_dim=4)
optimizer = optimizers.SGD(learning_rate=0.001)


@tf.function(jit_compile=True)
def train_step(data):
    x, y = data
    with tf.GradientTape() as tape:
        loss = ops.sum((y - model(x)) ** 2)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


steps = 0
for data in dataset():
    loss = train_step(data)
    steps += 1
print(f"steps {steps} loss {float(loss):.4f} iterations {int(optimizer.iterations.numpy())}")
