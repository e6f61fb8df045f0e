"""Feeding replicas through tf.distribute: one input pipeline per worker, files sharded."""

from __future__ import annotations

import tensorflow as tf

from ingest.metadata._info import load_info
from ingest.pipeline._dataset import make_dataset
from ingest.pipeline._request import ScaledStart, check_start

__all__ = ["distribute"]


def _batches_before(start_step, per_step: int):
    """An input pipeline's start_batch for global step `start_step` (None, an int or a variable)."""
    if start_step is None or per_step == 1:
        return start_step
    if isinstance(start_step, int) and not isinstance(start_step, bool):
        return start_step * per_step
    return ScaledStart(start_step, per_step)


def _is_tpu(strategy) -> bool:
    return any(cls.__name__.startswith("TPUStrategy") for cls in type(strategy).__mro__)


def distribute(
    strategy: tf.distribute.Strategy,
    path,
    *,
    global_batch_size: int,
    static_shapes: bool | None = None,
    drop_remainder: bool | None = None,
    start_step=None,
    **kwargs,
):
    """A distributed dataset for `strategy`, built with `make_dataset` once per input pipeline.

    Each pipeline reads its own subset of shard files and batches
    `global_batch_size / num_replicas_in_sync` records per replica. Under TPUStrategy,
    `static_shapes` and `drop_remainder` default to True (TPUs need fixed shapes).
    Other keyword arguments go to `make_dataset`.

    `start_step` resumes: each new iterator starts at that global step of the stream, an
    int or a scalar integer variable read when the iterator makes its first batch (a step
    counter restored from a checkpoint, which the step taking that batch must not add
    to before it is read). tf.distribute's iterators cannot be
    checkpointed themselves (tensorflow/tensorflow#56372); each input pipeline seeks to
    `start_step` times the batches it gives per step (its replicas), so the restored run
    reads exactly the batches the interrupted one would have read next. Needs a `seed`
    and the blocks layout's seekable order, as `make_dataset(start_batch=...)` does.
    """
    if "start_batch" in kwargs:
        raise ValueError(
            "distribute takes start_step (global steps), not start_batch: each input pipeline gives "
            "several batches a step when it feeds several replicas"
        )
    if start_step is not None:
        check_start(start_step, name="start_step", unit="step", seed=kwargs.get("seed"))
    replicas = strategy.num_replicas_in_sync
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by the {replicas} replicas in sync; "
            f"use a multiple of {replicas}"
        )
    load_info(path)  # fail here, with a clear error, rather than inside the strategy
    if static_shapes is None:
        static_shapes = _is_tpu(strategy)
    if drop_remainder is None:
        drop_remainder = bool(static_shapes)

    def dataset_fn(input_context: tf.distribute.InputContext):
        per_step = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        return make_dataset(
            path,
            batch_size=input_context.get_per_replica_batch_size(global_batch_size),
            input_context=input_context,
            static_shapes=static_shapes,
            drop_remainder=drop_remainder,
            start_batch=_batches_before(start_step, per_step),
            **kwargs,
        )

    return strategy.distribute_datasets_from_function(dataset_fn)
