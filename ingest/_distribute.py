"""Feeding replicas through tf.distribute: one input pipeline per worker, files sharded."""

from __future__ import annotations

import tensorflow as tf

from ingest._dataset import make_dataset
from ingest._info import load_info

__all__ = ["distribute"]


def _is_tpu(strategy) -> bool:
    return any(cls.__name__.startswith("TPUStrategy") for cls in type(strategy).__mro__)


def distribute(
    strategy: tf.distribute.Strategy,
    path,
    *,
    global_batch_size: int,
    static_shapes: bool | None = None,
    drop_remainder: bool | None = None,
    **kwargs,
):
    """A distributed dataset for `strategy`, built with `make_dataset` once per input pipeline.

    Each pipeline reads its own subset of shard files and batches
    `global_batch_size / num_replicas_in_sync` records per replica. Under TPUStrategy,
    `static_shapes` and `drop_remainder` default to True (TPUs need fixed shapes).
    Other keyword arguments go to `make_dataset`.
    """
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
        return make_dataset(
            path,
            batch_size=input_context.get_per_replica_batch_size(global_batch_size),
            input_context=input_context,
            static_shapes=static_shapes,
            drop_remainder=drop_remainder,
            **kwargs,
        )

    return strategy.distribute_datasets_from_function(dataset_fn)
