"""The per-chunk work of a conversion as pure functions (no Beam, no files).

Chunk (Arrow batch, row numbers, bad rows)
  -> typed(...)   the source types each column; rows without a label are set aside
  -> encode_batch TFRecord frames of tf.train.Example, one per good row
  -> routed(...)  each frame's split and shard, the frames of each shard back to back
"""

from __future__ import annotations

import dataclasses

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_jobs.encode.tfrecord import frames_data, key_ranges
from beam_jobs.output import shard_plan
from beam_jobs.sources import carried_schema, readers

__all__ = ["Typed", "typed", "Routing", "splits_of", "route", "routed"]


@dataclasses.dataclass(frozen=True)
class Typed:
    cols: list  # [(name, dtype, Arrow array)] of the good rows
    rows: np.ndarray  # source row number of each good row
    bad: list  # BadRow, every row set aside while reading or typing


def typed(source, path: str, chunk: readers.Chunk, types: dict, label: str | None) -> Typed:
    """Types a chunk with its source's rules; quarantines bad cells, missing labels, and
    text labels that are none of a carried schema's classes."""
    cols, bad, bad_mask = source.type_chunk(path, chunk, types)
    rows = chunk.rows
    if label is not None:
        labels = next(arr for name, _, arr in cols if name == label)
        missing = ~np.asarray(labels.is_valid().to_numpy(zero_copy_only=False), bool)
        for i in np.flatnonzero(missing & ~bad_mask):
            bad.append(
                readers.BadRow(
                    path,
                    int(rows[i]),
                    f"label column {label!r} is missing",
                    source.row_text(chunk, i),
                    "missing_label",
                )
            )
        bad_mask = bad_mask | missing
        schema = source.schema
        if schema is not None and schema.labels and types[label] == ("bytes", ()):
            # A class id is a position in the schema's classes: a new value would need a new
            # id, and every span's ids must mean the same classes.
            unknown = carried_schema.unknown_labels(labels, schema.labels) & ~bad_mask
            for i in np.flatnonzero(unknown):
                reason = schema.unknown_label_reason(labels[int(i)].as_py())
                bad.append(readers.BadRow(path, int(rows[i]), reason, source.row_text(chunk, i), "unknown_label"))
            bad_mask = bad_mask | unknown
    if bad_mask.any():
        keep = pa.array(~bad_mask)
        cols = [(name, dtype, arr.filter(keep)) for name, dtype, arr in cols]
        rows = rows[~bad_mask]
    return Typed(cols, rows, bad)


@dataclasses.dataclass(frozen=True)
class Routing:
    """What decides where a chunk's records go."""

    splits: tuple  # ((name, fraction), ...)
    num_shards: tuple  # per split
    shuffle: bool
    seed: int


def splits_of(hashes: np.ndarray, routing: Routing) -> np.ndarray:
    """Each record's split index, decided by its hash."""
    return shard_plan.assign_splits(hashes, dict(routing.splits))


def route(split_of: np.ndarray, routing: Routing, where: tuple, first_record: dict):
    """Yields (split, shard, row indices in writing order) for every shard the chunk feeds.

    `split_of` is each record's split (`splits_of`); `where` is the chunk's (file index, part,
    chunk index) and `first_record[split]` how many records of that split the file part
    held before it: together they place records in shards (`shard_plan.assign_shards`).
    """
    file_index, part, chunk_index = where
    for s in np.unique(split_of):
        s = int(s)
        ids = np.flatnonzero(split_of == s)
        shard_of = shard_plan.assign_shards(
            len(ids),
            routing.num_shards[s],
            shuffle=routing.shuffle,
            seed=routing.seed,
            file_index=file_index,
            chunk_index=chunk_index,
            first_record=first_record.get(s, 0),
            part_index=part,
        )
        if routing.shuffle:
            # Each shard's records leave the chunk in random order, so the commit only
            # has to interleave these runs at random to shuffle the shard uniformly.
            within = np.random.default_rng([routing.seed, file_index, part, chunk_index, s]).permutation(len(ids))
            order = within[np.argsort(shard_of[within], kind="stable")]
        else:
            order = np.argsort(shard_of, kind="stable")
        ordered = ids[order]
        for shard, first, end in key_ranges(np.bincount(shard_of, minlength=routing.num_shards[s])):
            yield s, shard, ordered[first:end]


def routed(frames: pa.Array, split_of: np.ndarray, routing: Routing, where: tuple, first_record: dict):
    """Yields (split, shard, frame bytes, frame lengths) for every shard the chunk feeds (`route`)."""
    for s, shard, rows in route(split_of, routing, where, first_record):
        whole = len(rows) == len(frames) and np.all(rows[1:] > rows[:-1])
        data, lengths = frames_data(frames if whole else frames.take(rows))
        yield s, shard, data, lengths


def key_hashes(keys: pa.Array) -> np.ndarray:
    """CRC32C of each --split_key value (as text), so a key's records share a split."""
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        keys = pc.cast(keys, pa.string())
    value = google_crc32c.value
    return np.fromiter(
        (value(k or b"") if isinstance(k, bytes) else value((k or "").encode()) for k in keys.to_pylist()),
        np.uint32,
        len(keys),
    )
