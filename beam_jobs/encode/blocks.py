"""Block layout encoder: K consecutive rows -> one `tf.train.Example` of packed columns.

The format is in docs/block_format.md. A block is itself an Example whose features are
lists, so it is encoded by the row encoder (`encode_batch`) over one "row" per block:
each column is regrouped with Arrow offsets into one list per block (missing values
written as the column's default, their positions in `F/missing`), and the encoder's
slots, varints, framing and CRCs do the rest, with no protobuf object per block.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_jobs.encode.examples import encode_batch
from ingest import contract

__all__ = ["ROWS_FEATURE", "block_columns", "encode_blocks"]

ROWS_FEATURE = contract.BLOCK_ROWS_FEATURE
_NATURAL_DEFAULT = {"int64": 0, "float32": 0.0, "bytes": b""}
_ARROW = {"int64": pa.int64(), "float32": pa.float32(), "bytes": pa.large_binary()}


def block_starts(num_rows: int, block_rows: int) -> np.ndarray:
    """[0, K, 2K, ..., num_rows]: where each block starts, and the end."""
    return np.append(np.arange(0, num_rows, block_rows, dtype=np.int64), np.int64(num_rows))


def _per_block(values: pa.Array, starts: np.ndarray, mask=None) -> pa.Array:
    """One list per block: values[starts[b]:starts[b + 1]] (null where `mask` is False)."""
    offsets = pa.array(starts, pa.int64())
    if mask is None:
        return pa.LargeListArray.from_arrays(offsets, values)
    return pa.LargeListArray.from_arrays(offsets, values, mask=pa.array(~mask))


def _filled(values: pa.Array, dtype: str, default) -> pa.Array:
    value = _NATURAL_DEFAULT[dtype] if default is None else default
    if dtype == "bytes" and isinstance(value, str):
        value = value.encode("utf-8")
    return pc.fill_null(values.cast(_ARROW[dtype]), pa.scalar(value, _ARROW[dtype]))


def block_columns(columns, num_rows: int, block_rows: int, defaults: dict | None = None) -> tuple:
    """[(name, dtype, array)] of rows -> ([(name, dtype, array)] of blocks, rows per block).

    `columns` are the canonical arrays the row encoder takes (int64, float32 or
    large_binary, or lists of them); `defaults[name]` replaces the natural default.
    """
    if block_rows < 1:
        raise ValueError(f"block_rows must be at least 1, got {block_rows}")
    defaults = defaults or {}
    names = {name for name, _, _ in columns}
    taken = sorted(({ROWS_FEATURE} | {d for n in names for d in contract.block_feature_names(n)}) & names)
    if taken:
        raise ValueError(
            f"column(s) {taken} take a name the block layout uses for its own features (docs/block_format.md): "
            "rename them, or write the rows layout"
        )
    starts = block_starts(num_rows, block_rows)
    sizes = np.diff(starts)
    out = [(ROWS_FEATURE, "int64", _per_block(pa.array(sizes, pa.int64()), np.arange(len(sizes) + 1)))]
    for name, dtype, arr in columns:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
        default = defaults.get(name)
        if pa.types.is_fixed_size_list(arr.type):
            k = arr.type.list_size
            values = arr.values.slice(arr.offset * k, len(arr) * k)
            # A missing row's k slots hold whatever the writer left: its default instead.
            values = pc.if_else(pa.array(np.repeat(present, k)), values, pa.nulls(len(values), values.type))
            out.append((name, dtype, _per_block(_filled(values, dtype, default), starts * k)))
        elif pa.types.is_large_list(arr.type) or pa.types.is_list(arr.type):
            arr = arr.cast(pa.large_list(arr.type.value_type))
            lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
            row_offsets = np.concatenate([[0], np.cumsum(lengths)])
            values = pc.list_flatten(arr)  # the values of present rows, in row order
            out.append((name, dtype, _per_block(values.cast(_ARROW[dtype]), row_offsets[starts])))
            out.append((name + contract.ROW_LENGTHS_SUFFIX, "int64", _per_block(pa.array(lengths, pa.int64()), starts)))
        else:
            out.append((name, dtype, _per_block(_filled(arr, dtype, default), starts)))
        if not present.all():
            missing = np.flatnonzero(~present)
            block_of = np.searchsorted(starts, missing, side="right") - 1
            positions = pa.array(missing - starts[block_of], pa.int64())
            per_block = np.searchsorted(block_of, np.arange(len(sizes) + 1))
            has = np.bincount(block_of, minlength=len(sizes)) > 0
            out.append((name + contract.MISSING_SUFFIX, "int64", _per_block(positions, per_block, mask=has)))
    return out, sizes


def encode_blocks(columns, num_rows: int, block_rows: int, defaults: dict | None = None):
    """Encodes rows as framed blocks of up to `block_rows` rows.

    Returns `(buffer, frame_offsets, crcs, rows_per_block)` (see `encode_batch`).
    """
    blocks, sizes = block_columns(columns, num_rows, block_rows, defaults)
    buf, offsets, crcs = encode_batch(blocks, len(sizes), framed=True)
    return buf, offsets, crcs, sizes
