"""Pure planning: shard counts, split fractions, and record-to-split/shard assignment."""

from __future__ import annotations

import math

import numpy as np

from ingest.contract import check_split_name

__all__ = [
    "MIN_SHARD_MB",
    "DEFAULT_TARGET_SHARD_MB",
    "plan_num_shards",
    "parse_splits",
    "assign_splits",
    "assign_shards",
    "mix32",
]

# Shards of 100-200 MB keep per-file open/seek cost negligible on object storage while
# giving enough files to interleave and to shard across input pipelines.
DEFAULT_TARGET_SHARD_MB = 128
MAX_SHARD_MB = 200
MIN_SHARD_MB = 10
# Records per contiguous block when shuffling is off: blocks go round-robin to shards, so
# shards stay within one block of each other in size and keep source order inside.
NO_SHUFFLE_BLOCK_ROWS = 512


def plan_num_shards(estimated_bytes: int, *, target_shard_mb: float = DEFAULT_TARGET_SHARD_MB) -> int:
    """Number of shards so that each holds about `target_shard_mb`.

    Never plans shards under MIN_SHARD_MB unless the whole split is smaller (then one).
    """
    if target_shard_mb <= 0:
        raise ValueError(f"target shard size must be positive, got {target_shard_mb} MB")
    mb = estimated_bytes / 2**20
    n = max(1, math.ceil(mb / target_shard_mb))
    if n > 1 and mb / n < MIN_SHARD_MB:
        n = max(1, math.floor(mb / MIN_SHARD_MB))
    return n


def parse_splits(spec: str | None) -> dict:
    """`"train=0.8,eval=0.2"` -> {"train": 0.8, "eval": 0.2}; None -> {"train": 1.0}."""
    if not spec:
        return {"train": 1.0}
    out = {}
    for part in spec.split(","):
        name, sep, frac = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--splits expects NAME=FRACTION,... (e.g. train=0.8,eval=0.2), got {spec!r}")
        check_split_name(name)
        if name in out:
            raise ValueError(f"--splits names split {name!r} twice")
        try:
            value = float(frac)
        except ValueError:
            raise ValueError(f"--splits: fraction for {name!r} must be a number, got {frac!r}") from None
        if not 0 < value <= 1:
            raise ValueError(f"--splits: fraction for {name!r} must be in (0, 1], got {value}")
        out[name] = value
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--splits fractions must sum to 1, got {total:g} from {spec!r}")
    return out


def mix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer: spreads CRC values (which are linear) uniformly."""
    h = h.astype(np.uint32, copy=True)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def assign_splits(hashes: np.ndarray, fractions: dict) -> np.ndarray:
    """Split index per record from a stable 32-bit hash; same hash, same split, any runner."""
    if len(fractions) == 1:
        return np.zeros(len(hashes), np.int64)
    edges = np.cumsum(list(fractions.values()))[:-1] * 2.0**32
    return np.searchsorted(edges, mix32(hashes).astype(np.float64), side="right").astype(np.int64)


def assign_shards(
    n: int,
    num_shards: int,
    *,
    shuffle: bool,
    seed: int,
    file_index: int,
    chunk_index: int,
    first_record: int,
    part_index: int = 0,
) -> np.ndarray:
    """Shard index for `n` consecutive records of one split within one chunk.

    `part_index` is the byte range of a file read in parts (0 for a whole file).
    Shuffled: a random shard per record from a generator keyed by (seed, file, part,
    chunk), so reruns repeat it. Not shuffled: contiguous blocks round-robin, keyed by the
    record's position in its file part, so each shard keeps source order.
    """
    if num_shards == 1:
        return np.zeros(n, np.int64)
    if shuffle:
        rng = np.random.default_rng([seed, file_index, part_index, chunk_index])
        return rng.integers(0, num_shards, size=n)
    positions = first_record + np.arange(n, dtype=np.int64)
    return (positions // NO_SHUFFLE_BLOCK_ROWS + file_index + part_index) % num_shards
