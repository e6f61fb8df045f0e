"""Keras: resume `model.fit` mid-epoch after preemption, at the exact next batch.

Keras' `BackupAndRestore(save_freq=N)` saves weights and optimizer every N batches but
restores only the epoch number: resumed, fit starts that epoch again at its first step.
The data can continue at the exact next batch anyway: `make_dataset(...,
start_batch=model.optimizer.iterations)` is read when fit creates its iterator, after the
backup was restored. `StopAtStep` then ends training after as many steps as an
uninterrupted run, which Keras' epoch count (restarted mid-epoch) would overshoot.
"""

from __future__ import annotations

import keras

__all__ = ["StopAtStep"]


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
