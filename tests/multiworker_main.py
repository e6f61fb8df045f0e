"""One worker of the MultiWorkerMirroredStrategy test; TF_CONFIG names the cluster and this task.

    TF_CONFIG=... python -m tests.multiworker_main DATASET OUT_JSON
Writes the ids this worker's input pipeline delivered in one epoch, the training losses and
weights, and the ids of a resumed stream against the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import ingest  # noqa: E402


def main(path: str, out: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
    # One epoch through the distributed dataset ingest builds: which records reached this worker.
    epoch = ingest.distribute(strategy, path, global_batch_size=32, label=False, shuffle=False, num_epochs=1)
    ids = []
    for batch in epoch:
        for local in strategy.experimental_local_results(batch["id"]):
            ids.extend(int(v) for v in local.numpy())

    # Keras 3's model.fit does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585,
    # tensorflow/tensorflow#72388): train with the strategy's own custom-loop API instead.
    train = ingest.distribute(
        strategy,
        path,
        global_batch_size=32,
        features=["x"],
        num_epochs=None,
        seed=0,
        preprocess=lambda f, y: (f["x"][:, None], y),
    )
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(3)])
        optimizer = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=32)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

    iterator = iter(train)
    losses = [float(train_step(iterator)) for _ in range(4)]
    weights = [float(v) for v in tf.reshape(model.trainable_variables[0], [-1]).numpy()]

    # Resuming at a global step (what a restored optimizer.iterations holds): each worker's
    # pipeline seeks to that step of its own stream.
    def local_ids(ds, n):
        it = iter(ds)
        return [
            [int(v) for t in strategy.experimental_local_results(next(it)["id"]) for v in t.numpy()] for _ in range(n)
        ]

    def stream(**kwargs):
        return ingest.distribute(strategy, path, global_batch_size=32, label=False, num_epochs=None, seed=4, **kwargs)

    step = tf.Variable(0, dtype=tf.int64)
    uninterrupted = local_ids(stream(), 40)  # 31.25 steps an epoch: across its end
    resumed = stream(start_step=step)
    step.assign(25)
    with open(out, "w") as f:
        json.dump(
            {
                "ids": ids,
                "losses": losses,
                "weights": weights,
                "uninterrupted": uninterrupted,
                "resumed": local_ids(resumed, 15),
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
