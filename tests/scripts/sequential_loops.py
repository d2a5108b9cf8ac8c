"""Scripts that train several things one after another in one process (SPEC §3: loops):
python sequential_loops.py KIND.

twomodels: a small model trained 100 steps (~50 ms), then a larger one built (with a
           600 MB table) and trained 30 steps (~110 ms): two loops, a healthy script, no
           memory leak and no outlier.
kfold:     4 folds, a new model and optimizer per fold, 40 steps each (~30 ms): 4 loops.
keras:     (Keras) a small model's fit, then a larger model's fit: two loops.
mirrored:  (Keras) one fit under MirroredStrategy, 10 epochs of 16 steps with validation
           (4 steps), over tf.data of unknown length: every epoch ends in a call that meets
           the end of the data.
tfcustom:  (TensorFlow) a custom loop (GradientTape, a tf.function step) over tf.data, 4
           epochs of 19 batches, then a wider model and a new optimizer, 4 epochs more: two loops.
epochloader: 6 epochs over a DataLoader with 2 workers (not persistent, 20 batches): the
           call that meets the end of the data shuts the workers down.
"""
import sys
import time


def torch_loop(model, steps, pause, batch=64, width=256):
    import torch
    import torch.nn as nn

    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(pause)  # the rest of a real step (logging, a larger batch's compute)


def main(kind):
    if kind == "keras":
        return keras_two_fits()
    if kind == "mirrored":
        return keras_mirrored()
    if kind == "tfcustom":
        return tf_custom_loops()
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if kind == "twomodels":
        torch_loop(nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1)), 100, 0.05)
        big = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))
        big.register_buffer("table", torch.ones(150_000_000))  # a 600 MB lookup table built with it
        torch_loop(big, 30, 0.1)
    elif kind == "kfold":
        for fold in range(4):
            model = nn.Sequential(nn.Linear(256, 128 * (fold + 1)), nn.ReLU(), nn.Linear(128 * (fold + 1), 1))
            torch_loop(model, 40, 0.03)
    elif kind == "epochloader":
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randn(640, 256), torch.randn(640, 1))
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(6):
            for x, y in DataLoader(data, batch_size=32, num_workers=2):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    print("done", kind)


def keras_mirrored():
    import numpy as np
    import keras
    import tensorflow as tf

    x, y = np.random.rand(640, 32).astype("float32"), np.random.rand(640, 1).astype("float32")

    def dataset(a, b):  # (filter: a length tf.data cannot know, so Keras reads to the end)
        return tf.data.Dataset.from_tensor_slices((a, b)).filter(lambda *_: True).batch(32)

    with tf.distribute.MirroredStrategy().scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(dataset(x[:512], y[:512]), epochs=10, validation_data=dataset(x[512:], y[512:]), verbose=0)
    print("done mirrored")


def tf_custom_loops():
    import numpy as np
    import keras
    import tensorflow as tf

    x, y = np.random.rand(608, 32).astype("float32"), np.random.rand(608, 1).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # 19 batches
    for width in (16, 256):
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(1)])
        opt = keras.optimizers.Adam()

        @tf.function
        def step(a, b):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(a, training=True) - b) ** 2)
            grads = tape.gradient(loss, model.trainable_weights)
            opt.apply_gradients(zip(grads, model.trainable_weights))

        for _ in range(4):
            for a, b in data:
                step(a, b)
    print("done tfcustom")


def keras_two_fits():
    import numpy as np
    import keras

    x, y = np.random.rand(640, 32).astype("float32"), np.random.rand(640, 1).astype("float32")
    for width in (16, 512):
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    print("done keras")


if __name__ == "__main__":
    main(sys.argv[1])
