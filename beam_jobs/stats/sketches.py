"""Distinct counts and most frequent values past exact counting, a chunk at a time.

    hash64(values) -> uint64 per value     numpy over Arrow's buffers, no Python per value
    Distinct.add(hashes)                   the K smallest hashes (KMV): the distinct count
    Frequent.add(values, hashes, counts)   Misra-Gries counters keyed by hash: the top values

Why not DataSketches: in datasketches 5.2 only KLL takes numpy arrays; `hll_sketch`,
`cpc_sketch`, `update_theta_sketch` and `frequent_strings_sketch` take one value a call, with
the GIL held, after each value is made a Python str. On 200k distinct URL-like values
that was ~75 ms a column (str 21, HLL 23, frequent items 28); these take ~30 ms, which
numpy and Arrow spend without the GIL (`python -m benchmarks.statistics --parts text`).

Both sketches merge (a bundle's into another's) with the same error bounds as one fed
every value, and neither depends on the order the values come in.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

__all__ = ["hash64", "Distinct", "Frequent", "DISTINCT_K", "FREQUENT_K", "DISTINCT_ERROR"]

# Hashes kept by `Distinct`: its estimate's relative standard error is 1 / sqrt(K - 2) =
# 0.78%, so it is within DISTINCT_ERROR = 2.576 standard errors (2.0%) of the true count
# with 99% probability, as the HyperLogLog sketch it replaces (lg_k 14) was.
DISTINCT_K = 16_384
DISTINCT_ERROR = math.ceil(2.576 / math.sqrt(DISTINCT_K - 2) * 1e4) / 1e4  # 0.0202
# Counters kept by `Frequent`: each count it gives is within N / (K + 1) of the truth
# (N: the values counted), as DataSketches' frequent items with lg_max_map 13 (~N / 6000).
FREQUENT_K = 8_192

_U64 = np.uint64
_S33 = _U64(33)
_M1, _M2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)  # MurmurHash3's fmix64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_EMPTY = _U64(0x2545F4914F6CDD1D)  # so that b"" does not hash to 0
_MASKS = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [2**64 - 1], np.uint64)  # the first i bytes


def _mixed(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, in place: a bijection whose every output bit depends
    on every input bit."""
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


def hash64(values: pa.Array) -> np.ndarray:
    """A 64-bit hash of each value of a binary or string array without nulls, equal for equal
    bytes wherever they sit in whichever array.

    Each value is read as 8-byte words (the last one zero-padded); each word is mixed with
    its place in the value, the mixed words summed, and the sum mixed with the length. Work
    per word, not per byte: on 200k URL-like values (52 bytes) 10-35 ms, where a Python call
    per value (hash, or an HLL update) cost ~23 ms holding the GIL.
    """
    if not (pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)):
        values = values.cast(pa.large_binary())  # int64 offsets; the data buffer is not copied
    n = len(values)
    if n == 0:
        return np.empty(0, np.uint64)
    offsets = np.frombuffer(values.buffers()[1], np.int64, n + 1, values.offset * 8)
    base, total = int(offsets[0]), int(offsets[-1] - offsets[0])
    lengths = np.diff(offsets)
    data = np.zeros(total + 8, np.uint8)  # 8 bytes past the end: the last word's load stays inside
    if total:
        data[:total] = np.frombuffer(values.buffers()[2], np.uint8, total, base)
    # An 8-byte word at every byte position: a value's words are loaded where they start.
    words_at = np.ndarray((total + 1,), "<u8", buffer=data, strides=(1,))
    words = np.maximum((lengths + 7) >> 3, 1)  # an empty value has one word, of no bytes
    ends = np.cumsum(words)
    firsts = ends - words
    # Each word's byte position and place in its value, as running sums of their steps.
    step = np.full(int(ends[-1]), 8, np.int64)
    place = np.ones(int(ends[-1]), np.int64)
    starts = offsets[:-1] - base
    step[0], place[0] = starts[0], 0
    step[firsts[1:]] = starts[1:] - (starts[:-1] + 8 * (words[:-1] - 1))
    place[firsts[1:]] = 1 - words[:-1]
    w = words_at[np.cumsum(step)]
    kept = np.full(len(w), 8, np.int64)
    kept[ends - 1] = lengths - 8 * (words - 1)
    w &= _MASKS[kept]
    w ^= np.cumsum(place).astype(np.uint64) * _GOLDEN
    summed = np.add.reduceat(_mixed(w), firsts)
    summed ^= lengths.astype(np.uint64) * _GOLDEN + _EMPTY
    return _mixed(summed)


class Distinct:
    """The DISTINCT_K smallest distinct hashes seen (k minimum values): a uniform sample of
    the distinct values, whose K-th smallest hash h estimates their number as
    (K - 1) / (h / 2**64), unbiased, relative standard error 1 / sqrt(K - 2).

    Two merge by keeping the K smallest of both. Once full, a chunk's hashes are compared
    with the K-th smallest, and only the few below it are sorted in.
    """

    def __init__(self):
        self.smallest = np.empty(0, np.uint64)  # sorted, distinct, at most DISTINCT_K

    def add(self, hashes: np.ndarray, *, distinct: bool = False) -> None:
        """Adds `hashes`; `distinct`: no two are equal (a feature's exact counts, when they
        overflow), so that only their K smallest need sorting."""
        if len(self.smallest) == DISTINCT_K:
            hashes = hashes[hashes < self.smallest[-1]]
        elif distinct and len(hashes) > DISTINCT_K:
            hashes = np.partition(hashes, DISTINCT_K - 1)[:DISTINCT_K]
        if len(hashes):
            # A sort and a comparison: np.union1d (np.unique) took 10x as long in numpy 2.4.
            merged = np.sort(np.concatenate([self.smallest, hashes]))
            self.smallest = merged[np.concatenate([[True], merged[1:] != merged[:-1]])][:DISTINCT_K]

    def merge(self, other: "Distinct") -> None:
        self.add(other.smallest)

    @property
    def exact(self) -> bool:
        """Whether fewer than K distinct hashes were seen: then each was kept, and counted."""
        return len(self.smallest) < DISTINCT_K

    def estimate(self) -> int:
        if self.exact:
            return len(self.smallest)
        return int(round((DISTINCT_K - 1) * 2.0**64 / (float(self.smallest[-1]) + 1.0)))


class Frequent:
    """Misra-Gries counters (the algorithm of DataSketches' frequent items) of at most
    FREQUENT_K values, keyed by their hash, each with one copy of its value.

    A chunk's counts are added to the counters; when more than K values then hold one, the
    (K+1)-th largest count is taken off every counter and those left at zero or below are
    dropped. So a counter is never above its value's true count and at most `error` below
    it, the sum of what was taken off, which is at most N / (K + 1): each cut takes it from
    at least K + 1 counters (Agarwal et al., "Mergeable summaries", 2012). Merging two adds
    their counters, cuts the same way, and adds up their errors.

    A value counted once in a chunk and held by no counter never survives a cut (that
    takes at least 1 off): such values are counted, not gathered, and where every value is
    distinct (ids, URLs) a chunk's values are never copied.
    """

    def __init__(self):
        self.hashes = np.empty(0, np.uint64)  # sorted
        self.counts = np.empty(0, np.int64)  # each > 0
        self.values = pa.array([], pa.large_binary())  # the value of each counter
        self.error = 0

    def add(
        self, values: pa.Array, hashes: np.ndarray, counts: np.ndarray | None = None, *, distinct: bool = False
    ) -> None:
        """Counts `values` (their `hash64`), each `counts` times (None: once each); `distinct`:
        no two are equal, and need no grouping."""
        if not len(hashes):
            return
        if distinct:
            self._add(hashes, np.asarray(counts, np.int64), values, np.arange(len(hashes)))
            return
        order = np.argsort(hashes)  # 1.4 ms per 32k hashes; Arrow's dictionary_encode: 1.3
        ordered = hashes[order]
        firsts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        weights = np.ones(len(order), np.int64) if counts is None else np.asarray(counts, np.int64)[order]
        self._add(ordered[firsts], np.add.reduceat(weights, firsts), values, order[firsts])

    def merge(self, other: "Frequent") -> None:
        self.error += other.error
        self._add(other.hashes, other.counts, other.values, np.arange(len(other.hashes)))

    def _add(self, hashes: np.ndarray, counts: np.ndarray, values: pa.Array, rows: np.ndarray) -> None:
        """Adds distinct `hashes` counted `counts` times; the value of hashes[i] is values[rows[i]]."""
        at = np.searchsorted(self.hashes, hashes)
        held = at < len(self.hashes)
        held[held] = self.hashes[at[held]] == hashes[held]
        mine = self.counts.copy()
        mine[at[held]] += counts[held]  # distinct hashes: no counter is added to twice
        new, new_counts, new_rows = hashes[~held], counts[~held], rows[~held]
        cut = 0
        if len(mine) + len(new) > FREQUENT_K:
            several = new_counts > 1  # the others are 1: below any cut
            above_one = np.concatenate([mine[mine > 1], new_counts[several]])
            if len(above_one) > FREQUENT_K:
                cut = int(np.partition(above_one, len(above_one) - FREQUENT_K - 1)[len(above_one) - FREQUENT_K - 1])
            else:  # K or fewer above 1, more than K in all: the (K+1)-th largest is a 1
                cut = 1
            new, new_counts, new_rows = new[several], new_counts[several], new_rows[several]
        keep_mine = mine > cut
        keep_new = new_counts > cut
        self.error += cut
        hashes_kept = np.concatenate([self.hashes[keep_mine], new[keep_new]])
        order = np.argsort(hashes_kept)
        self.hashes = hashes_kept[order]
        self.counts = np.concatenate([mine[keep_mine] - cut, new_counts[keep_new] - cut])[order]
        taken = values.take(pa.array(new_rows[keep_new], pa.int64())).cast(pa.large_binary())
        held_values = self.values.filter(pa.array(keep_mine)) if len(self.values) else self.values
        self.values = pa.concat_arrays([held_values, taken]).take(pa.array(order, pa.int64()))

    def most_frequent(self) -> list:
        """[(value as bytes, count)], most frequent first (ties: the larger value first), of
        the values whose counter is above `error`, so that none is there by error alone
        (DataSketches' NO_FALSE_POSITIVES). Each count is its counter plus `error`: never
        below the true count, at most `error` above it."""
        sure = np.flatnonzero(self.counts > self.error)
        values = self.values.take(pa.array(sure, pa.int64())).to_pylist()
        counts = (self.counts[sure] + self.error).tolist()
        return sorted(zip(values, counts), key=lambda vc: (vc[1], vc[0]), reverse=True)
