"""What a conversion counted: rows, quarantine reasons, records per split, feature facts.

Each bundle fills one `ConversionStats`; it crosses stages packed into one pickled blob
(`pack`) and Beam combines the blobs with `ConversionStats.merge_packed`.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_jobs.stats.features import EXACT_VALUES, FeatureStats, add_numbers_together, share_keys

__all__ = ["ConversionStats"]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_large_list(t) or pa.types.is_list(t) or pa.types.is_fixed_size_list(t)


def _add(into: dict, key, n: int) -> None:
    into[key] = into.get(key, 0) + n


@dataclasses.dataclass
class ConversionStats:
    rows: int = 0  # rows read, good and bad
    bad: int = 0  # rows quarantined
    split_records: dict = dataclasses.field(default_factory=dict)  # split name -> records
    missing: dict = dataclasses.field(default_factory=dict)  # feature -> records without a value
    min_len: dict = dataclasses.field(default_factory=dict)  # list feature -> shortest list
    max_len: dict = dataclasses.field(default_factory=dict)  # list feature -> longest list
    reasons: dict = dataclasses.field(default_factory=dict)  # quarantine kind -> rows
    counters: dict = dataclasses.field(default_factory=dict)  # source-specific counts (image formats, actions)
    bent: dict = dataclasses.field(default_factory=dict)  # float32 feature -> [values changed, largest change]
    statistics: dict = dataclasses.field(default_factory=dict)  # split name -> {feature: FeatureStats}

    def add_bad(self, kinds) -> None:
        for kind in kinds:
            self.bad += 1
            _add(self.reasons, kind, 1)

    def add_counters(self, counters: dict) -> None:
        for k, v in counters.items():
            _add(self.counters, k, v)

    def add_bent(self, bent: dict) -> None:
        """Adds a chunk's `readers.Chunk.bent`: counts add up, the largest change is the largest."""
        for name, (n, change) in bent.items():
            mine = self.bent.setdefault(name, [0, 0.0])
            mine[0] += n
            mine[1] = max(mine[1], change)

    def add_records(self, split: str, n: int) -> None:
        _add(self.split_records, split, n)

    def add_features(self, cols, n: int) -> None:
        """Missing values and list lengths of `n` good records' columns [(name, dtype, arr)]."""
        for name, _, arr in cols:
            present = pc.sum(arr.is_valid()).as_py() or 0
            _add(self.missing, name, n - present)
            if _is_list(arr.type):
                lengths = pc.list_value_length(arr).drop_null()
                if len(lengths):
                    self._lengths(name, pc.min(lengths).as_py(), pc.max(lengths).as_py())

    def add_statistics(self, cols, kinds: dict, split_of: np.ndarray, split_names: tuple, keys) -> None:
        """Per-split statistics of good records' columns [(name, dtype, arr)]; `split_of`: each row's split,
        `keys`: the rows' sampling keys (`stats.features.chunk_keys`)."""
        parts = [(int(split_of[0]), None)] if len(split_of) and (split_of == split_of[0]).all() else None
        if parts is None:
            parts = [(int(s), np.flatnonzero(split_of == s)) for s in np.unique(split_of)]
        for s, rows in parts:
            mine = self.statistics.setdefault(split_names[s], {})
            take = None if rows is None else pa.array(rows)
            split_keys = keys if rows is None else keys.subset(rows)
            together: dict = {}  # dtype -> ([FeatureStats], [column]): dense scalar numbers
            for name, dtype, arr in cols:
                stats = mine.get(name)
                if stats is None:
                    stats = mine[name] = FeatureStats(dtype, kinds[name], _is_list(arr.type))
                part = arr if take is None else arr.take(take)
                dense = stats.kind == "number" and not stats.is_list and part.null_count == 0 and len(part)
                stats.add(part, split_keys, numbers=not dense)
                if dense:
                    group = together.setdefault(dtype, ([], []))
                    group[0].append(stats)
                    group[1].append(part)
            for group, columns in together.values():
                add_numbers_together(group, columns, split_keys)

    def pack(self) -> bytes:
        """The stats as one pickled blob, the form they cross stages in: Beam's coder
        re-encodes an object at every stage boundary and for every size estimate (11
        times per conversion, 2-5 MB each with the statistics' samples), a blob it copies."""
        for features in self.statistics.values():
            share_keys(features.values())
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def unpack(blob: bytes) -> "ConversionStats":
        return pickle.loads(blob)

    @classmethod
    def merge_packed(cls, blobs) -> bytes:
        """`merge` for packed stats: Beam's combiner of the bundles' blobs."""
        blobs = sorted(blobs, key=len, reverse=True)
        if not blobs:  # the merge of nothing: a side input's default
            return cls().pack()
        if len(blobs) == 1:  # Beam calls it on single blobs too: nothing to merge
            return blobs[0]
        # Into the largest (the one holding most statistics), unpacked here for this merge
        # alone: its samples and counts are not copied, as `merge` copies its inputs'.
        base = cls.unpack(blobs[0])
        base._add_all(cls.unpack(b) for b in blobs[1:])
        return base.pack()

    def _lengths(self, name: str, lo: int, hi: int) -> None:
        self.min_len[name] = min(lo, self.min_len.get(name, lo))
        self.max_len[name] = max(hi, self.max_len.get(name, hi))

    @classmethod
    def merge(cls, many) -> "ConversionStats":
        """A new ConversionStats holding all of `many`'s counts; they stay as they were."""
        out = cls()
        out._add_all(many)
        return out

    def _add_all(self, many) -> None:
        """Adds the counts of every ConversionStats in `many` to these."""
        for s in many:
            self.rows += s.rows
            self.bad += s.bad
            for mine, theirs in (
                (self.split_records, s.split_records),
                (self.missing, s.missing),
                (self.reasons, s.reasons),
                (self.counters, s.counters),
            ):
                for k, v in theirs.items():
                    _add(mine, k, v)
            self.add_bent(s.bent)
            for name, lo in s.min_len.items():
                self._lengths(name, lo, s.max_len[name])
            for split, features in s.statistics.items():
                mine = self.statistics.setdefault(split, {})
                for name, stats in features.items():
                    if name not in mine:
                        mine[name] = FeatureStats.like(stats)  # inputs stay as they were
                    mine[name].merge(stats)

    def distinct_values(self, name: str) -> list | None:
        """Every distinct value of feature `name` over all splits, as text, where they were
        counted exactly and are at most EXACT_VALUES (a label's classes); None otherwise.
        The metadata's statistics keep only the TOP_STORED most frequent: a label's classes
        need them all."""
        per_split = [features[name] for features in self.statistics.values() if name in features]
        if not per_split or per_split[0].counts is None:
            return None
        total = FeatureStats.like(per_split[0])
        for stats in per_split:
            total.merge(stats)
        return total.counts.exact_values(EXACT_VALUES)

    def statistics_json(self, split_names) -> dict:
        """{"overall": {feature: {...}}, "splits": {split: {feature: {...}}}} for the metadata."""
        splits = {split: {n: s.to_json() for n, s in self.statistics.get(split, {}).items()} for split in split_names}
        filled = [split for split in split_names if self.statistics.get(split)]
        if len(filled) == 1:
            return {"overall": splits[filled[0]], "splits": splits}
        overall: dict = {}
        for split in filled:
            for name, stats in self.statistics[split].items():
                if name not in overall:
                    overall[name] = FeatureStats.like(stats)
                overall[name].merge(stats)
        return {"overall": {n: s.to_json() for n, s in overall.items()}, "splits": splits}
