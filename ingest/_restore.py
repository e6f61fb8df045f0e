"""Iterators whose restore from another pipeline's checkpoint says so in ingest's words.

The seekable order checks a restored iterator in the graph (`tf.debugging.Assert` on the
fingerprint of the blocks, batch size and window, and on a given seed): the only place a
check runs while tf.data restores. TensorFlow wraps the message in ~500 characters of its
own over three lines (DeserializeIterator, the iterator's stages, the assert's node, "Make
sure the dataset definition has not changed"). The iterator made here raises the same
error class with ingest's sentence alone, at the restore or at the next batch.
"""

from __future__ import annotations

import re

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, iterator_ops

__all__ = ["MARK", "one_line", "restorable"]

# Every restore check's message starts so (ingest/blocks/seekable.py).
MARK = "this iterator was restored from a checkpoint"


def one_line(message: str) -> str | None:
    """The restore check's sentence in a TensorFlow error message; None when it holds none.

    An assert's data are printed as "[text] [1] [text]" after "assertion failed: ".
    """
    found = re.search(r"assertion failed: (\[" + re.escape(MARK) + r".*?\])\s*\n", message, re.S)
    if found is None:
        return None
    return " ".join(part.strip() for part in re.findall(r"\[([^\[\]]*)\]", found.group(1)))


def restorable(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` (the same graph), whose eager iterators re-raise a restore check's error as one line."""
    return _Restorable(ds)


class _Restorable(dataset_ops.UnaryUnchangedStructureDataset):
    def __init__(self, input_dataset: tf.data.Dataset):
        self._input_dataset = input_dataset
        super().__init__(input_dataset, input_dataset._variant_tensor)

    def __iter__(self):
        if tf.executing_eagerly() and not tf.inside_function():
            return _Iterator(dataset=self)
        return super().__iter__()


class _Iterator(iterator_ops.OwnedIterator):
    def _restore_from_tensors(self, restored_tensors):
        try:
            return super()._restore_from_tensors(restored_tensors)
        except tf.errors.OpError as e:
            _reraise(e)

    def __next__(self):
        try:
            return super().__next__()
        except tf.errors.OpError as e:
            _reraise(e)


def _reraise(e: tf.errors.OpError):
    line = one_line(e.message)
    if line is None:
        raise e
    raise type(e)(e.node_def, e.op, line) from None
