"""Keras 3 (TensorFlow backend): a subclassed Model overriding train_step with a
GradientTape (the usual custom-training recipe), 2 epochs x 5 batches."""
# expect: {"train": 10, "callback": true,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["GetNext"]}}
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np

keras.utils.set_random_seed(0)
callbacks = []
if "--callback" in sys.argv:
    from stepscope.integrations.keras import StepscopeCallback

    callbacks.append(StepscopeCallback())
rng = np.random.default_rng(0)
import tensorflow as tf  # noqa: E402


class CustomModel(keras.Sequential):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            pred = self(x, training=True)
            loss = tf.reduce_mean(tf.square(pred - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


model = CustomModel([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.loss_tracker = keras.metrics.Mean(name="loss")
model.compile(optimizer=keras.optimizers.SGD(0.05))
x, y = rng.normal(size=(80, 8)).astype("float32"), rng.normal(size=(80, 1)).astype("float32")
history = model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
print(f"loss {history.history['loss'][-1]:.4f} iterations {int(model.optimizer.iterations.numpy())}")
