"""A training loop preempted and resumed: the README's checkpoint recipe, run as its own process.

    python tests/train_resume_child.py DATASET CKPT_DIR STEPS DIE_AFTER OUT.npy [eager|graph]

Trains a linear model on `x` -> `y` for STEPS steps, checkpointing the data iterator with
the weights every 10 steps. With DIE_AFTER > 0 the process dies abruptly (os._exit, as a
preempted VM would) after that step; run again, it restores the newest checkpoint and
goes on. At the end it writes the weights to OUT.npy. With `graph` the step takes its
batch inside a tf.function that is given the iterator, as Keras's steps do.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import ingest


def main(path, directory, steps, die_after, out, mode="eager"):
    # A seed, so that the uninterrupted run it is compared with reads the same order.
    ds = ingest.make_dataset(path, batch_size=32, num_epochs=None, features=["x"], label="y", seed=7)
    it = iter(ds)
    w = tf.Variable(tf.zeros([1]), name="w")
    b = tf.Variable(tf.zeros([]), name="b")
    step = tf.Variable(0, dtype=tf.int64, name="step")
    ckpt = tf.train.Checkpoint(iterator=it, w=w, b=b, step=step)
    manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    manager.restore_or_initialize()

    @tf.function
    def train(features, y):
        x = tf.cast(features["x"], tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x * w + b - tf.cast(y, tf.float32)))
        for v, g in zip((w, b), tape.gradient(loss, [w, b])):
            v.assign_sub(0.01 * g)

    @tf.function
    def train_on_next(iterator):
        train(*next(iterator))

    while int(step) < steps:
        if mode == "graph":
            train_on_next(it)
        else:
            train(*next(it))
        step.assign_add(1)
        if int(step) % 10 == 0:
            manager.save()
        if int(step) == die_after:
            os._exit(3)
    np.save(out, np.concatenate([w.numpy(), [b.numpy()]]))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), a[4], *a[5:])
