"""`model.fit` preempted mid-epoch and resumed: the README's Keras recipe, as its own process.

    python tests/keras_resume_child.py DATASET BACKUP_DIR EPOCHS STEPS_PER_EPOCH DIE_AFTER OUT.npy

Fits a linear model on `x` -> `y` with Keras' BackupAndRestore saving every 10 batches.
With DIE_AFTER > 0 the process dies abruptly (os._exit, as a preempted VM would) after
that step; run again, fit restores the backup and the data goes on at the next batch.
At the end it writes the weights to OUT.npy.
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


def main(path, backup, epochs, steps_per_epoch, die_after, out):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    # A seed, so the resumed run reads the order the interrupted one started; the start is
    # read when fit creates its iterator, after BackupAndRestore restored the optimizer.
    ds = ingest.make_dataset(
        path, batch_size=32, num_epochs=None, features=["x"], label="y", seed=7, start_batch=model.optimizer.iterations
    )
    ds = ds.map(lambda features, y: (tf.reshape(features["x"], [-1, 1]), tf.cast(y, tf.float32)))
    callbacks = [
        keras.callbacks.BackupAndRestore(backup, save_freq=10),
        ingest.StopAtStep(epochs * steps_per_epoch),
        _DieAfter(die_after),
    ]
    model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
    assert int(model.optimizer.iterations) == epochs * steps_per_epoch, int(model.optimizer.iterations)
    np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5])
