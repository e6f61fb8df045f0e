"""Keras: resume `model.fit` mid-epoch after preemption, at the exact next batch.

Keras' `BackupAndRestore(save_freq=N)` saves weights and optimizer every N batches but
restores only the epoch number: resumed, fit starts that epoch again at its first step.
The data can continue at the exact next batch anyway: `FitStart` copies the restored
`optimizer.iterations` into a variable of its own before fit makes its iterator, and
`make_dataset(..., start_batch=start.step)` seeks there. `StopAtStep` then ends training
after as many steps as an uninterrupted run, which Keras' epoch count (restarted
mid-epoch) would overshoot.
"""

from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["FitStart", "StopAtStep"]


class FitStart(keras.callbacks.Callback):
    """The step `fit` starts at (0, or the step `BackupAndRestore` restored), in `step`.

    Give `make_dataset(..., start_batch=start.step)` and pass this callback to `fit`. Not
    `start_batch=model.optimizer.iterations`: an iterator reads its start when it makes its
    first batch, during fit's first step, and that step adds 1 to `iterations` with nothing
    ordering the two, so the stream started at batch 1 (21 after a restore at 20) on most
    runs and at batch 0 (20) on others.
    """

    def __init__(self):
        super().__init__()
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="fit_start_step")

    def on_epoch_begin(self, epoch, logs=None):
        # After every callback's on_train_begin (BackupAndRestore restores there, listed
        # before or after this one) and before fit makes its iterator; no step is running.
        # Later epochs reuse fit's iterator (`num_epochs=None`), which read it already.
        self.step.assign(int(self.model.optimizer.iterations))


class StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the optimizer has taken `steps` steps in all (across restarts)."""

    def __init__(self, steps: int):
        super().__init__()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) >= self.steps:
            self.model.stop_training = True
