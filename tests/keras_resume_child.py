"""`model.fit` preempted mid-epoch and resumed: the README's Keras recipe, as its own process.

    python tests/keras_resume_child.py DATASET BACKUP_DIR EPOCHS STEPS_PER_EPOCH DIE_AFTER OUT.npy IDS

Fits a linear model on `x` -> `y` with Keras' BackupAndRestore saving every 10 batches.
With DIE_AFTER > 0 the process dies abruptly (os._exit, as a preempted VM would) after
that step; run again, fit restores the backup and the data goes on at the next batch.
At the end it writes the weights to OUT.npy. IDS gets a line per batch fit's iterator
yields, in order (the first ids in it): the batch of each step. IDS.stream gets the
same for the dataset's stream read from its start, without Keras, for EPOCHS *
STEPS_PER_EPOCH batches: what those steps must have read.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import ingest


class _DieAfter(keras.callbacks.Callback):
    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if self.step and int(self.model.optimizer.iterations) == self.step:
            os._exit(3)


def _first_ids(ids):
    return " ".join(str(i) for i in ids[:3])


def main(path, backup, epochs, steps_per_epoch, die_after, out, ids):
    keras.utils.set_random_seed(1)  # the global seed takes part in the order's seed: the same in every run

    def dataset(**kwargs):
        # A seed, so the resumed run reads the order the interrupted one started.
        return ingest.make_dataset(
            path, batch_size=32, num_epochs=None, features=["x", "id"], label="y", seed=7, **kwargs
        )

    with open(f"{ids}.stream", "w") as f:  # a dataset of its own: its order is the one fit's iterator reads
        f.writelines(_first_ids(b[0]["id"].numpy().tolist()) + "\n" for b in dataset().take(epochs * steps_per_epoch))

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    start = ingest.FitStart()

    def pair(features, y):
        # The map runs in order (maybe ahead of the steps): line N is the batch of step N.
        logged = tf.print(features["id"][:3], output_stream=f"file://{ids}", summarize=3)
        with tf.control_dependencies([logged]):
            return tf.reshape(features["x"], [-1, 1]), tf.cast(y, tf.float32)

    ds = dataset(start_batch=start.step).map(pair)
    callbacks = [
        keras.callbacks.BackupAndRestore(backup, save_freq=10),
        start,
        ingest.StopAtStep(epochs * steps_per_epoch),
        _DieAfter(die_after),
    ]
    model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
    assert int(model.optimizer.iterations) == epochs * steps_per_epoch, int(model.optimizer.iterations)
    np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5], a[6])
