"""Text features' vocabularies: every distinct value counted, then ranked, in one pass.

    chunk columns -> count_chunk: {feature: (values, counts)}      (pyarrow, per chunk)
      -> Counts.add / merge: exact counts, per bundle and globally, each feature's dropped
         (None) once it holds more distinct values than the limit
      -> ranked(counts, carried): the vocabulary, most frequent first (ties: the larger value
         first, bytewise), after
         the values a carried vocabulary (--schema_from) already gives ids

A vocabulary is what `make_dataset(text="ids")` maps each value to: value vocabulary[i - 1]
has id i, 0 is out of vocabulary (Keras StringLookup's convention). The ranking follows
Keras' `StringLookup.adapt` and TFT's `vocabulary`: most frequent first. Counting is a hash
pass in Arrow (`value_counts`), with no Python per value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Counts", "count_chunk", "ids_of", "lookup_of", "ranked"]

_VALUE, _COUNT = "value", "count"


def _table(values: pa.Array, counts) -> pa.Table:
    return pa.table({_VALUE: values.cast(pa.large_binary()), _COUNT: pa.array(counts, pa.int64())})


def count_chunk(cols, names) -> dict:
    """{name: its values' counts in this chunk} for the columns `names` among `cols`
    ([(name, dtype, array)], canonical arrays: large_binary or lists of it). Missing values
    are not counted (a missing row is read as the feature's default, not a value)."""
    out = {}
    for name, _, arr in cols:
        if name not in names:
            continue
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
            arr = pc.list_flatten(arr)
        counted = pc.value_counts(arr.drop_null())
        out[name] = _table(counted.field(0), counted.field(1))
    return out


class Counts:
    """Exact value counts per feature, each dropped (None) past `limit` distinct values.

    Counts are kept as the chunks' tables and summed only when their rows could pass the
    limit, and when read: summing at every chunk was 1.1 s of a 5.3-s conversion of 500k
    rows of distinct values (ids, URLs).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._parts: dict = {}  # name -> [pa.Table (value, count)], or None: too many values

    @property
    def names(self) -> list:
        return list(self._parts)

    def dropped(self, name: str) -> bool:
        return name in self._parts and self._parts[name] is None

    def table(self, name: str):
        """The feature's counts, one row per distinct value; None past the limit."""
        parts = self._parts.get(name, [])
        if parts is None:
            return None
        return _summed(parts) if parts else _table(pa.array([], pa.large_binary()), [])

    def add(self, counted: dict) -> None:
        for name, table in counted.items():
            self._extend(name, [table])

    def merge(self, other: "Counts") -> None:
        for name, parts in other._parts.items():
            self._extend(name, parts)

    def _extend(self, name: str, parts) -> None:
        held = self._parts.get(name, [])
        if held is None or parts is None:
            self._parts[name] = None
            return
        held = held + parts
        if sum(t.num_rows for t in held) > self.limit:
            summed = _summed(held, self.limit)
            held = None if summed is None else [summed]
        self._parts[name] = held

    @staticmethod
    def merge_all(parts) -> "Counts":
        """The merge of `parts` (a CombineGlobally's function); of nothing, no counts."""
        parts = list(parts)
        total = Counts(parts[0].limit if parts else 0)
        for part in parts:
            total.merge(part)
        return total


def _summed(parts: list, limit: int | None = None) -> pa.Table | None:
    """One row per distinct value of `parts`, its counts added up; None if there are more
    than `limit` distinct values (known before anything is added).

    A dictionary encoding and one scatter-add, not Acero's group_by: counting 6 chunks of
    32,768 distinct URLs took it ~170 ms (its thread pool, on a busy 2-core machine), this
    10-25 ms; and a feature past the limit needs only the number of its distinct values.
    """
    if len(parts) == 1 and (limit is None or parts[0].num_rows <= limit):
        return parts[0]
    values = pa.concat_arrays([c for t in parts for c in t.column(_VALUE).chunks])
    encoded = pc.dictionary_encode(values)
    if limit is not None and len(encoded.dictionary) > limit:
        return None
    counts = np.concatenate([t.column(_COUNT).to_numpy() for t in parts])
    summed = np.zeros(len(encoded.dictionary), np.int64)
    np.add.at(summed, encoded.indices.to_numpy(zero_copy_only=False), counts)
    return _table(encoded.dictionary, summed)


def ranked(table, limit: int, carried: tuple = ()) -> tuple:
    """A feature's vocabulary: `carried` (a carried schema's vocabulary, whose ids never
    change), then the values it lacks, most frequent first, ties by the larger value first
    (bytewise), as Keras' `StringLookup.adapt` (`np.lexsort((tokens, counts))[::-1]`) and
    `statistics.top` order them.

    Returns (values as str, note): the note says why values were left out of it, or is
    empty. `table` None (more distinct values than `limit`) keeps the carried vocabulary.
    """
    if table is None:
        note = f"more than {limit:,} distinct values" if not carried else "its new values pass the limit"
        return tuple(carried), note
    order = pc.sort_indices(table, sort_keys=[(_COUNT, "descending"), (_VALUE, "descending")])
    values = table.column(_VALUE).take(order)
    if carried:
        known = pa.array([v.encode("utf-8") for v in carried], pa.large_binary())
        values = values.filter(pc.invert(pc.is_in(values, value_set=known)))
    new = [v.decode("utf-8", "surrogateescape") for v in values.to_pylist()]
    if len(carried) + len(new) > limit:
        return tuple(carried), f"{len(new):,} new values would pass the limit of {limit:,}: they are out of vocabulary"
    return tuple(carried) + tuple(new), ""


def lookup_of(vocabulary: pa.Array) -> dict:
    """{value (bytes): its id}, built once per vocabulary and worker: Arrow's `index_in`
    rebuilds its hash set of the vocabulary at every call (a 500k-value vocabulary made a
    4.5-s conversion take 80 s, called for every 64 blocks)."""
    return {v: i + 1 for i, v in enumerate(vocabulary.to_pylist())}


def ids_of(values: pa.Array, lookup: dict) -> np.ndarray:
    """Each of `values`' id in the vocabulary behind `lookup` (`lookup_of`), 0 for a value not
    in it: a dictionary lookup per distinct value, not per value."""
    encoded = pc.dictionary_encode(values.cast(pa.large_binary()))
    distinct = encoded.dictionary.to_pylist()
    ids = np.fromiter((lookup.get(v, 0) for v in distinct), np.int64, len(distinct))
    return ids[encoded.indices.to_numpy(zero_copy_only=False)]
