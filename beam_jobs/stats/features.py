"""Per-feature statistics, gathered while a conversion encodes (no extra read of the input).

One `FeatureStats` per feature and split; each bundle fills its own and Beam merges them
(`merge`), so Dataflow computes the same numbers as the DirectRunner. What goes into
`dataset_info.json` (`to_json`) is described in `ingest.contract.FeatureStatistics`.

    numbers    count, mean and M2 merged by Chan's parallel update (population std),
               exact min/max (infinities included)/zeros/nan/inf/neg_inf, quantiles of
               the finite values from a uniform sample
    text       value counts: exact up to VOCABULARY_LIMIT (2**17) distinct values, as the
               vocabulary counts them; beyond, a batched distinct-count sketch and
               Misra-Gries counters for `top` (`stats.sketches`), with their error bounds
               (`distinct_error`, `top_error`)
    int        value counts: exact up to EXACT_VALUES distinct values; beyond, the feature is
               treated as a number only (no vocabulary to learn)
    bytes      lengths (min/max/mean) and `distinct` (counted by 64-bit digest, exactly up
               to EXACT_VALUES, then sketched); list features also get list lengths

Why a sample and not a KLL sketch for quantiles: the conversion runs at ~500k rows/s and
the statistics may cost 10% of it; `kll_doubles_sketch.update` takes ~35 ms per million
values, which alone is ~4x that budget on the benchmark corpus' 15 numeric columns, while
a threshold sample only compares each value's random key with a threshold
(`python -m benchmarks.statistics` measures both, speed and rank error).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_jobs.stats import sketches
from ingest import contract

__all__ = [
    "FeatureStats",
    "cut_long_values",
    "add_numbers_together",
    "Keys",
    "kind_of",
    "chunk_keys",
    "share_keys",
    "QUANTILES",
    "EXACT_VALUES",
    "SAMPLE_SIZE",
]

QUANTILES = 101  # every percentile: first = min, last = max
# A uniform sample of at least this many values has a rank error under 1% at each
# quantile with 99% confidence (2.58 * 0.5 / sqrt(32768) = 0.71%); it holds up to twice as many.
SAMPLE_SIZE = 32_768
# Distinct values counted exactly per int64 or bytes feature and split, and the most
# classes a text label records (text features are counted up to contract.VOCABULARY_LIMIT).
EXACT_VALUES = 10_000
# Values held past the exact counts before they are hashed into the sketches, as one array:
# each numpy call releases the GIL and, beside a busy Python thread, takes it back only
# after up to sys.getswitchinterval() (5 ms). Beside one, 200k distinct values of a column
# took 1.6 s hashed 32k at a time, 0.37 s at 128k (DataSketches' call per value: 0.25 s,
# holding the GIL, so that the busy thread ran at 51% of its speed; here at 81%).
_SKETCH_ROWS = 1 << 17
TOP_STORED = 1_000  # most frequent values written to the metadata (the whole vocabulary when it fits)
# A text value longer than this is stored in `top` cut to this many characters, the last
# one '…' (1,000 values of 100 KB made a 40 MB dataset_info.json); its top is then not
# exact (`top_exact` false), so no vocabulary is built of cut values.
TOP_VALUE_CHARS = 256


def kind_of(dtype: str, text: bool) -> str:
    if dtype in ("int64", "float32", "float64"):
        return "number"
    return "text" if text else "binary"


class Keys:
    """A chunk's random sampling keys, one per row, shared by every feature of the chunk.

    Features without missing values keep equal sample thresholds, so the rows under a
    threshold are found once per chunk, not once per feature.
    """

    def __init__(self, keys: np.ndarray):
        self.keys = keys
        self._under: dict = {}

    def under(self, threshold: float) -> tuple:
        """(rows whose key is under `threshold`, their keys)."""
        found = self._under.get(threshold)
        if found is None:
            rows = np.flatnonzero(self.keys < threshold)
            found = self._under[threshold] = (rows, self.keys.take(rows))
        return found

    def subset(self, rows: np.ndarray) -> "Keys":
        """The keys of `rows`: positions, or a mask."""
        return Keys(self.keys.take(np.flatnonzero(rows) if rows.dtype == bool else rows))

    def repeat(self, lengths: np.ndarray) -> "Keys":
        return Keys(np.repeat(self.keys, lengths))


def chunk_keys(n: int, seed) -> Keys:
    """The sampling keys of a chunk's `n` rows, reproducible from `seed`.

    float32 halves what a sample holds and ships; its 2**-24 steps stay far below the
    thresholds a split of under ~10**11 values needs.
    """
    return Keys(np.random.default_rng(seed).random(n, dtype=np.float32))


def _span(lo, hi, new_lo, new_hi) -> tuple:
    """The range (lo, hi) widened to hold (new_lo, new_hi); None: nothing seen yet."""
    return (new_lo if lo is None else min(lo, new_lo), new_hi if hi is None else max(hi, new_hi))


@dataclasses.dataclass
class _Moments:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, n: int, mean: float, m2: float) -> None:
        """Chan et al.'s pairwise update: stable however the values are split into parts."""
        if n == 0:
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total


class _Sample:
    """A threshold sample: every value seen whose random key is under `threshold`.

    That is a uniform sample of the stream, and two of them merge by taking the lower
    threshold. When it reaches 2 * SAMPLE_SIZE values the threshold is lowered so that
    about SAMPLE_SIZE stay: one comparison, where keeping exactly the SAMPLE_SIZE
    smallest keys (bottom-k) takes a partition, which measured 3x the cost of the rest
    of a numeric column's statistics. Chunks' values are kept as pieces and joined only
    when the threshold drops, not copied on every chunk.
    """

    def __init__(self):
        self.pieces: list = []  # [(values as stored: int64, float32 or float64, float32 keys)]
        self.size = 0
        self.threshold = 1.0

    def add(self, values: np.ndarray, keys: Keys) -> None:
        if self.threshold < 1.0:
            rows, keys = keys.under(self.threshold)
            values = values.take(rows)
        else:
            keys = keys.keys
        if not len(keys):
            return
        self.pieces.append((values, keys))
        self.size += len(keys)
        if self.size >= 2 * SAMPLE_SIZE:
            self._lower(self.threshold * SAMPLE_SIZE / self.size)

    def _joined(self) -> tuple | None:
        """(values, keys) as one piece; None while empty. An empty sample holds no piece, not
        an empty float64 one: joined with int64 values, that would make them float64 and
        round every value past 2**53 (it did, in each merge into a new accumulator)."""
        if len(self.pieces) > 1:
            self.pieces = [tuple(np.concatenate(part) for part in zip(*self.pieces))]
        return self.pieces[0] if self.pieces else None

    def _lower(self, threshold: float) -> None:
        self.threshold = threshold
        joined = self._joined()
        if joined is None:
            return
        values, keys = joined
        keep = np.flatnonzero(keys < threshold)  # a random mask indexes 8x slower than its positions
        self.pieces = [(values.take(keep), keys.take(keep))]
        self.size = len(keep)

    def _shrink(self) -> None:
        """Down to ~SAMPLE_SIZE values: what is shipped between workers and sorted at the end.

        A sample already lowered holds SAMPLE_SIZE +- ~0.6% values (binomial), at times a
        few over: one within a quarter over is kept, so that shrinking twice changes
        nothing (`share_keys` shrinks before pickling does).
        """
        if self.size > SAMPLE_SIZE * 5 // 4:
            self._lower(self.threshold * SAMPLE_SIZE / self.size)
        self._joined()

    def merge(self, other: "_Sample") -> None:
        if other.threshold < self.threshold:
            self._lower(other.threshold)
        joined = other._joined()
        if joined is not None:
            self.add(joined[0], Keys(joined[1]))

    def __getstate__(self):
        self._shrink()
        state = dict(self.__dict__)
        if self.pieces:
            values, keys = self.pieces[0]
            state["pieces"] = [(_narrowed(values), keys)]
        return state

    def quantiles(self, lo, hi) -> list:
        """QUANTILES values from `lo` to `hi`; the sample holds a value once any was added."""
        self._shrink()
        values, _ = self._joined()
        at = np.rint(np.linspace(0, len(values) - 1, QUANTILES)).astype(np.int64)
        q = np.sort(values)[at].tolist()  # numpy's vectorized sort: 10x a partition at 101 ranks
        q[0], q[-1] = lo, hi  # exact, not sampled
        return q


def _narrowed(values: np.ndarray) -> np.ndarray:
    """Integers in the smallest signed type that holds them (a label's sample: 1 byte a
    value, not 8); they widen again when joined with int64 ones."""
    if values.dtype != np.int64 or not len(values):
        return values
    lo, hi = values.min(), values.max()
    for narrow in (np.int8, np.int16, np.int32):
        if np.iinfo(narrow).min <= lo and hi <= np.iinfo(narrow).max:
            return values.astype(narrow)
    return values


def share_keys(features) -> None:
    """Lets the samples of these FeatureStats that hold the same rows' keys hold one array.

    Features without missing values sample the same rows of every chunk (`Keys`), so
    their samples' keys are equal but, once joined, separate arrays; pickled once
    instead of once a feature, a shard of the benchmark corpus crosses stages in 2.1 MB
    instead of 5.0 (with `_narrowed` integers).
    """
    seen: dict = {}  # (sample size, threshold) -> the distinct keys arrays seen
    for stats in features:
        for sample in (stats.sample, stats.list_lengths.sample if stats.list_lengths else None):
            if sample is None:
                continue
            sample._shrink()
            joined = sample._joined()
            if joined is None:
                continue
            values, keys = joined
            alike = seen.setdefault((len(keys), sample.threshold), [])
            same = next((other for other in alike if np.array_equal(other, keys)), None)
            if same is None:
                alike.append(keys)
            else:
                sample.pieces = [(values, same)]


def cut_long_values(top: list) -> tuple:
    """-> (`top` with each text value longer than TOP_VALUE_CHARS cut, whether one was)."""
    cut = False
    for t in top:
        if isinstance(t["value"], str) and len(t["value"]) > TOP_VALUE_CHARS:
            t["value"], cut = t["value"][: TOP_VALUE_CHARS - 1] + "…", True
    return top, cut


class _Counts:
    """Value counts: exact (Arrow arrays, compacted lazily) up to `limit` distinct values.

    kind  "text"    exact up to VOCABULARY_LIMIT, the vocabulary's own limit: a feature with a
                    vocabulary takes `distinct` and `top` from exact counts in every split, with
                    no sketch; past it, `sketches.Distinct` and `sketches.Frequent`
          "binary"  64-bit digests, exact up to EXACT_VALUES; past it, `sketches.Distinct`
          "number"  an int64 feature, exact up to EXACT_VALUES; past it, no counts at all
                    (a measure, not a category)

    The sketches take a chunk's hashes at a time (`sketches.hash64`), no Python call per value.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self.limit = contract.VOCABULARY_LIMIT if kind == "text" else EXACT_VALUES
        self.pending: list = []  # [(values, counts)] not yet compacted
        self.pending_rows = 0
        self.values = None  # pa.Array of distinct values, after compaction
        self.counts = np.empty(0, np.int64)
        self.distinct = self.frequent = None  # the sketches, once exact counting overflowed
        self.unsketched: list = []  # past the limit: chunks not yet in the sketches
        self.unsketched_rows = 0
        self.dropped = False  # a number feature with too many values

    def add(self, arr: pa.Array) -> None:
        if self.dropped or not len(arr):
            return
        if self.distinct is not None:  # past the limit: no exact counts (value_counts) any more
            self.unsketched.append(arr)
            self.unsketched_rows += len(arr)
            if self.unsketched_rows >= _SKETCH_ROWS:
                self._flush()
            return
        if pa.types.is_integer(arr.type):
            values, counts = _int_counts(arr.to_numpy(zero_copy_only=False))
            if len(values) > self.limit and self.kind == "number":
                self._drop()
                return
            self._add_counts(pa.array(values), counts)
            return
        vc = pc.value_counts(arr)
        self._add_counts(vc.field(0), vc.field(1).to_numpy().astype(np.int64))

    def _add_counts(self, values: pa.Array, counts: np.ndarray) -> None:
        if self.distinct is not None:
            self._sketch(values, counts)
            return
        self.pending.append((values, counts))
        self.pending_rows += len(values)
        if self.pending_rows > self.limit:
            self._compact()

    def _flush(self) -> None:
        """The chunks held past the limit into the sketches, as one array."""
        if not self.unsketched:
            return
        arr = pa.concat_arrays(self.unsketched)
        self.unsketched, self.unsketched_rows = [], 0
        hashes = _hashes(arr)
        self.distinct.add(hashes)
        if self.frequent is not None:
            self.frequent.add(arr, hashes)

    def _compact(self) -> None:
        self._flush()
        if not self.pending:
            return
        parts = [(self.values, self.counts)] if self.values is not None else []
        parts += self.pending
        self.pending, self.pending_rows = [], 0
        values, counts = _summed(pa.concat_arrays([v for v, _ in parts]), np.concatenate([c for _, c in parts]))
        if len(values) <= self.limit:
            self.values, self.counts = values, counts
        elif self.kind == "number":
            self._drop()
        else:
            self._to_sketches(values, counts)

    def _drop(self) -> None:
        """No counts: a number feature with too many values."""
        self.__init__(self.kind)
        self.dropped = True

    def _to_sketches(self, values: pa.Array | None, counts: np.ndarray) -> None:
        """From exact counts (these, which may be None) to the sketches."""
        self.values, self.counts = None, np.empty(0, np.int64)
        self.distinct = sketches.Distinct()
        self.frequent = sketches.Frequent() if self.kind == "text" else None
        if values is not None:
            self._sketch(values, counts)

    def _sketch(self, values: pa.Array, counts: np.ndarray) -> None:
        """Distinct values and their counts into the sketches."""
        hashes = _hashes(values)
        self.distinct.add(hashes, distinct=True)
        if self.frequent is not None:
            self.frequent.add(values, hashes, counts, distinct=True)

    def merge(self, other: "_Counts") -> None:
        if self.dropped or other.dropped:
            self._drop()
            return
        other._compact()
        if other.distinct is not None:
            if self.distinct is None:
                self._compact()
                self._to_sketches(self.values, self.counts)
            self.distinct.merge(other.distinct)
            if self.frequent is not None:
                self.frequent.merge(other.frequent)
        elif other.values is not None:
            self._add_counts(other.values, other.counts)

    def result(self, text: bool) -> dict:
        if self.dropped:
            return {}
        self._compact()
        if self.distinct is not None:
            estimate = {
                "distinct": self.distinct.estimate(),
                "distinct_exact": False,
                "distinct_error": sketches.DISTINCT_ERROR,
            }
            if self.frequent is None:
                return estimate
            items = self.frequent.most_frequent()[:TOP_STORED]
            texts = _as_text(pa.array([v for v, _ in items], pa.large_binary()))
            top, _ = cut_long_values([{"value": v, "count": c} for v, (_, c) in zip(texts, items)])
            return estimate | {"top": top, "top_exact": False, "top_error": self.frequent.error}
        if self.values is None:
            return {"distinct": 0, "distinct_exact": True, "top": [], "top_exact": True}
        # Keras' lookup order: most frequent first, ties by the value (bytes), larger first.
        # Sorted by Arrow: 2**17 values took 0.011 s, 0.10-0.15 s sorted in Python.
        table = pa.table({"count": self.counts, "value": self.values})
        order = pc.sort_indices(table, sort_keys=[("count", "descending"), ("value", "descending")])[:TOP_STORED]
        shown = self.values.take(order)
        values = _as_text(shown) if text else shown.to_pylist()
        counts = self.counts[order.to_numpy()].tolist()
        top, cut = cut_long_values([{"value": v, "count": c} for v, c in zip(values, counts)])
        return {"distinct": len(self.values), "distinct_exact": True, "top": top, "top_exact": not cut}

    def __getstate__(self):
        self._compact()  # summed counts and filled sketches, not the chunks they came from
        return dict(self.__dict__)

    def exact_values(self, limit: int) -> list | None:
        """Every distinct value, as text, while they are counted exactly and are at most
        `limit` (beyond TOP_STORED, which the metadata's `top` keeps); None otherwise."""
        if self.dropped:
            return None
        self._compact()
        if self.distinct is not None or (self.values is not None and len(self.values) > limit):
            return None
        return [] if self.values is None else _as_text(self.values)


def _hashes(values: pa.Array) -> np.ndarray:
    """The sketches' 64-bit hash of each value: binary features' digests are hashes already."""
    if pa.types.is_integer(values.type):
        return values.to_numpy(zero_copy_only=False).view(np.uint64)
    return sketches.hash64(values)


def _summed(values: pa.Array, counts: np.ndarray) -> tuple:
    """(distinct values, the sum of their counts): values seen in several parts, added up.

    A dictionary encoding and one scatter-add, not Acero's group_by: its plan costs ~0.2 ms
    a call whatever the size (2 x 12 values: 194 against 31 us; 2 x 9,000: 1.16 against
    0.51 ms), and each feature's counts are compacted in every bundle and merge.
    """
    encoded = pc.dictionary_encode(values)
    summed = np.zeros(len(encoded.dictionary), np.int64)
    np.add.at(summed, encoded.indices.to_numpy(zero_copy_only=False), counts)
    return encoded.dictionary, summed


def _int_counts(x: np.ndarray) -> tuple:
    """Distinct values and counts; a bincount when the range is narrow (labels, categories)."""
    lo, hi = int(x.min()), int(x.max())
    if hi - lo < 4 * len(x) + 1024:
        counts = np.bincount(x - lo)
        values = np.flatnonzero(counts)
        return values + lo, counts[values].astype(np.int64)
    values, counts = np.unique(x, return_counts=True)
    return values, counts.astype(np.int64)


def _digests(arr: pa.Array) -> pa.Array:
    """64-bit digests of binary values (images, blobs): counted instead of the bytes themselves."""
    digest = hashlib.blake2b
    joined = b"".join(digest(v, digest_size=8).digest() for v in arr.to_pylist())
    return pa.array(np.frombuffer(joined, dtype="<i8"))


def _as_text(values: pa.Array) -> list:
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        try:  # valid UTF-8 (the cast checks it), decoded by Arrow: half the time of bytes.decode per value
            return values.cast(pa.large_string()).to_pylist()
        except pa.ArrowInvalid:
            return [b.decode("utf-8", "replace") for b in values.to_pylist()]
    return [str(v) for v in values.to_pylist()]


@dataclasses.dataclass
class _Lengths:
    n: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None
    sample: _Sample | None = None  # list lengths only: their distribution

    def add(self, lengths: np.ndarray, keys: Keys | None) -> None:
        if not len(lengths):
            return
        self.min, self.max = _span(self.min, self.max, int(lengths.min()), int(lengths.max()))
        self.n += len(lengths)
        self.total += int(lengths.sum())
        if keys is not None:
            self.sample = self.sample or _Sample()
            self.sample.add(lengths.astype(np.int64), keys)

    def merge(self, other: "_Lengths") -> None:
        if other.n == 0:
            return
        self.min, self.max = _span(self.min, self.max, other.min, other.max)
        self.n += other.n
        self.total += other.total
        if other.sample is not None:
            self.sample = self.sample or _Sample()
            self.sample.merge(other.sample)

    def result(self) -> dict:
        if self.n == 0:
            return {"min": None, "max": None, "mean": None}
        out = {"min": self.min, "max": self.max, "mean": self.total / self.n}
        if self.sample is not None:
            out["quantiles"] = [int(round(q)) for q in self.sample.quantiles(self.min, self.max)[::10]]
        return out


def _as_stored(arr: pa.Array, dtype: str) -> np.ndarray:
    x = arr.to_numpy(zero_copy_only=False)
    if dtype == "float32" and x.dtype != np.float32:
        x = x.astype(np.float32)  # the stored values, not the source's wider ones
    return x


def _totals(x: np.ndarray) -> np.ndarray:
    """Sums along the last axis in float64: not finite when a NaN or an infinity is among them."""
    with np.errstate(invalid="ignore"):  # inf - inf
        return np.add.reduce(x, axis=-1, dtype=np.float64)


def _summarize(group: list, x: np.ndarray, totals: np.ndarray, keys: Keys) -> None:
    """Adds finite values to the number statistics: row j of the 2-D `x` to group[j].

    Few passes over the values, each one call for the whole group: this is most of the
    statistics' cost.
    """
    n = x.shape[1]
    lo, hi = x.min(axis=1).tolist(), x.max(axis=1).tolist()
    zeros = (n - np.count_nonzero(x, axis=1)).tolist()
    means = totals / n
    d = x - means[:, None]  # float64: `means` are
    # Not `d @ d`: BLAS' threads spin after each call and take the other core from the
    # reader and writer threads (measured: +0.4 CPU-s on a 500k-row conversion).
    m2 = np.einsum("ij,ij->i", d, d)
    for j, stats in enumerate(group):
        stats._add_summary(n, float(means[j]), float(m2[j]), lo[j], hi[j], zeros[j])
        stats.sample.add(x[j], keys)


def add_numbers_together(group: list, columns: list, keys: Keys) -> None:
    """The number statistics of several scalar features of one dtype, none missing, in
    one chunk: each statistic is one call over all of them (a 2-D array), not one per
    feature. A column with a NaN or an infinity goes through its own `_add_numbers`."""
    x = np.stack([_as_stored(c, group[0].dtype) for c in columns])  # (features, rows)
    totals = _totals(x)
    finite = np.isfinite(totals)
    for j in np.flatnonzero(~finite):
        group[j]._add_numbers(columns[j], keys)
    if not finite.all():
        rows = np.flatnonzero(finite)
        group, x, totals = [group[j] for j in rows], x[rows], totals[rows]
    if group:
        _summarize(group, x, totals, keys)


class FeatureStats:
    """The statistics of one feature in one split, mergeable."""

    def __init__(self, dtype: str, kind: str, is_list: bool):
        self.dtype, self.kind, self.is_list = dtype, kind, is_list
        self.count = self.missing = self.values = 0
        self.moments = _Moments() if kind == "number" else None
        self.extremes = [None, None]
        self.zeros = self.nan = self.inf = 0
        self.neg_inf = 0  # of `inf`: min is -inf when there is one, max +inf when `inf` has more
        self.sample = _Sample() if kind == "number" else None
        # Binary values are counted by digest: `distinct` only, no `top` of raw bytes.
        self.counts = _Counts(kind) if kind != "number" or dtype == "int64" else None
        self.lengths = _Lengths() if kind != "number" else None
        self.list_lengths = _Lengths() if is_list else None

    def add(self, arr: pa.Array, keys: Keys, *, numbers: bool = True) -> None:
        """Adds a chunk's column (`keys`: the rows' sampling keys); with `numbers=False`
        the number statistics are left to `add_numbers_together`."""
        valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
        present = len(arr) - arr.null_count
        self.count += present
        self.missing += arr.null_count
        if valid is not None:
            arr, keys = arr.filter(pa.array(valid)), keys.subset(valid)
        if self.is_list:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            self.list_lengths.add(lengths, keys)
            keys = keys.repeat(lengths)
            arr = pc.list_flatten(arr)
        self.values += len(arr)
        if self.kind == "number":
            if numbers:
                self._add_numbers(arr, keys)
        else:
            self.lengths.add(pc.binary_length(arr).to_numpy(zero_copy_only=False), None)
        if self.counts is not None:
            self.counts.add(_digests(arr) if self.kind == "binary" else arr)

    def _add_numbers(self, arr: pa.Array, keys: Keys) -> None:
        x = _as_stored(arr, self.dtype)
        total = _totals(x)
        if x.dtype.kind == "f" and not np.isfinite(total):  # a NaN or an infinity among them
            finite = np.isfinite(x)
            nan = np.isnan(x)
            self.nan += int(nan.sum())
            self.inf += int((~finite & ~nan).sum())
            self.neg_inf += int((x == -np.inf).sum())
            rows = np.flatnonzero(finite)
            x, keys = x.take(rows), keys.subset(rows)
            total = _totals(x)
        if len(x):
            _summarize([self], x[None, :], np.reshape(total, [1]), keys)

    def _add_summary(self, n: int, mean: float, m2: float, lo, hi, zeros: int) -> None:
        self.moments.add(n, mean, m2)
        self.zeros += zeros
        self.extremes = list(_span(*self.extremes, lo, hi))

    @classmethod
    def like(cls, other: "FeatureStats") -> "FeatureStats":
        """An empty accumulator for the same feature: merge into it to copy."""
        return cls(other.dtype, other.kind, other.is_list)

    def merge(self, other: "FeatureStats") -> None:
        """Adds `other`'s values; `other` is left as it was."""
        self.count += other.count
        self.missing += other.missing
        self.values += other.values
        self.nan += other.nan
        self.inf += other.inf
        self.neg_inf += other.neg_inf
        if self.moments is not None:
            self.sample.merge(other.sample)
            if other.moments.n:
                m = other.moments
                self._add_summary(m.n, m.mean, m.m2, *other.extremes, other.zeros)
        if self.counts is not None:
            self.counts.merge(other.counts)
        for mine, theirs in ((self.lengths, other.lengths), (self.list_lengths, other.list_lengths)):
            if mine is not None:
                mine.merge(theirs)

    def _quantiles(self, lo, hi) -> list:
        if not self.moments.n:
            return []
        q = self.sample.quantiles(lo, hi)
        return [int(v) for v in q] if self.dtype == "int64" else q

    def to_json(self) -> dict:
        out = {"count": self.count, "missing": self.missing}
        if self.is_list:
            out["values"] = self.values
            out["list_length"] = self.list_lengths.result()
        if self.kind == "number":
            m = self.moments
            lo, hi = self.extremes  # finite: the quantiles span them
            out.update(
                min=-np.inf if self.neg_inf else np.inf if lo is None and self.inf else lo,
                max=np.inf if self.inf > self.neg_inf else -np.inf if hi is None and self.inf else hi,
                mean=m.mean if m.n else None,
                std=float(np.sqrt(m.m2 / m.n)) if m.n else None,
                quantiles=self._quantiles(lo, hi),
                zeros=self.zeros,
                nan=self.nan,
                inf=self.inf,
                neg_inf=self.neg_inf,
            )
        else:
            out["length"] = self.lengths.result()
        if self.counts is not None:
            counts = self.counts.result(text=self.kind == "text")
            if self.kind == "binary":
                counts = {k: v for k, v in counts.items() if k.startswith("distinct")}
            out.update(counts)
        return out
