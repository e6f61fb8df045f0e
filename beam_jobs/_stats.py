"""What a conversion counted: rows, quarantine reasons, records per split, feature facts.

Each bundle fills one `ConversionStats`; Beam combines them with `ConversionStats.merge`
(the runner pickles the dataclass between stages, as TFDS does with its own).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ConversionStats"]


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

    def add_bad(self, kinds) -> None:
        for kind in kinds:
            self.bad += 1
            _add(self.reasons, kind, 1)

    def add_counters(self, counters: dict) -> None:
        for k, v in counters.items():
            _add(self.counters, k, v)

    def add_records(self, split: str, n: int) -> None:
        _add(self.split_records, split, n)

    def add_features(self, cols, n: int) -> None:
        """Missing values and list lengths of `n` good records' columns [(name, dtype, arr)]."""
        for name, _, arr in cols:
            present = pc.sum(arr.is_valid()).as_py() or 0
            _add(self.missing, name, n - present)
            if pa.types.is_large_list(arr.type) or pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
                lengths = pc.list_value_length(arr).drop_null()
                if len(lengths):
                    self._lengths(name, pc.min(lengths).as_py(), pc.max(lengths).as_py())

    def _lengths(self, name: str, lo: int, hi: int) -> None:
        self.min_len[name] = min(lo, self.min_len.get(name, lo))
        self.max_len[name] = max(hi, self.max_len.get(name, hi))

    @classmethod
    def merge(cls, many) -> "ConversionStats":
        out = cls()
        for s in many:
            out.rows += s.rows
            out.bad += s.bad
            for mine, theirs in (
                (out.split_records, s.split_records),
                (out.missing, s.missing),
                (out.reasons, s.reasons),
                (out.counters, s.counters),
            ):
                for k, v in theirs.items():
                    _add(mine, k, v)
            for name, lo in s.min_len.items():
                out._lengths(name, lo, s.max_len[name])
        return out
