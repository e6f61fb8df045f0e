"""The stream's batches as a `tf.data.Dataset`: a TensorFlow trainer fed by worker processes.

    Stream (K workers, or this process)
      -> per window, one Python call (`from_generator`): its batches as runs of one size,
         each column a [batches, rows, ...] view of the worker's slot
      -> from_generator's conversion: the one copy, into TensorFlow's memory, made
         before the generator resumes and frees the slot
      -> unbatch (in the runtime, no Python a batch) -> prefetch -> the trainer's graph

Design (g) of #45: the process stream for a trainer that consumes in-graph, where
`from_generator` over the loader's batches pays a Python call a batch (0.12x
`make_dataset` at batch 256 on 2 cores). Not `make_dataset`'s default: on this 2-core
machine it reads 0.68-1.04x `make_dataset` in-graph (medians over corpora, batch sizes and
1 or 2 workers; BENCHMARKS.md, "A TensorFlow trainer fed by worker processes"), since
the consumer's runtime and the workers share the same two cores; alone on a core the
hand-off moves 25M rows/s at batch 4096 and 6.3M at 256.
Whether it wins on a 16-core GPU host is what `benchmarks/device_probe.py proc` measures.
Its iterators do not checkpoint: each is a new pass of the stream from its first batch.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["batches"]


def batches(stream):
    """A `tf.data.Dataset` of `stream`'s batches, the same as `make_dataset`'s for its
    request (and TensorFlow's global seed when this is called); each iterator made from it
    is the stream's next pass."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    global_seed = context.global_seed()

    facts = stream.facts
    kind, names = facts["structure"]
    specs = [tf.TensorSpec((None, None, *inner), tf.as_dtype(dtype)) for dtype, inner in facts["columns"]]
    passes = itertools.count()

    def runs():
        for columns, ranges in stream.windows(next(passes), 0, global_seed):
            for run in _runs(columns, ranges):
                yield _packed(kind, names, run)

    ds = tf.data.Dataset.from_generator(runs, output_signature=_packed(kind, names, specs))
    return ds.unbatch().prefetch(1)


def _packed(kind: str, names: tuple, columns: list):
    features = dict(zip(names, columns))
    return (features, columns[-1]) if kind == "pair" else features


def _runs(columns: list, ranges: list):
    """A window's batches, consecutive batches of one size at a time: each column as a
    [batches, rows, ...] view (text: its values, made here)."""
    i = 0
    while i < len(ranges):
        size = ranges[i][1] - ranges[i][0]
        j = i + 1
        while j < len(ranges) and ranges[j][1] - ranges[j][0] == size:
            j += 1
        first, end = ranges[i][0], ranges[j - 1][1]
        yield [_rows(c, first, end).reshape((j - i, size, *c.shape[1:])) for c in columns]
        i = j


def _rows(column, first: int, end: int) -> np.ndarray:
    return column[first:end] if isinstance(column, np.ndarray) else column.rows(first, end)
