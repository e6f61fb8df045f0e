"""The statistics a conversion records, as typed objects (`DatasetInfo.statistics`).

In `dataset_info.json` they sit under "statistics": {"overall": {feature: {...}},
"splits": {split: {feature: {...}}}}, one object per feature with the field names below.
Numbers are over the values present (list features: every element); `min`, `max`,
`mean`, `std` and `quantiles` leave out NaN and infinities, which `nan` and `inf` count.
Pure Python: Beam workers read it without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

__all__ = ["ValueCount", "Lengths", "FeatureStatistics", "Statistics"]


@dataclasses.dataclass(frozen=True)
class ValueCount:
    value: Any  # str for text features, int for int64 ones
    count: int


@dataclasses.dataclass(frozen=True)
class Lengths:
    """Lengths in bytes (text and bytes values) or in elements (lists)."""

    min: int | None
    max: int | None
    mean: float | None
    quantiles: tuple = ()  # lists only: 11 evenly spaced, first = min, last = max


@dataclasses.dataclass(frozen=True)
class FeatureStatistics:
    count: int  # records with a value
    missing: int  # records without one
    values: int | None = None  # list features: elements over all records
    # numbers (int64 and float32 features)
    min: float | int | None = None
    max: float | int | None = None
    mean: float | None = None
    std: float | None = None  # population standard deviation
    quantiles: tuple = ()  # 101 evenly spaced (every percentile), rank error under 1%
    zeros: int | None = None
    nan: int | None = None
    inf: int | None = None
    # text features, int64 features of up to 10,000 distinct values; bytes: `distinct` only
    distinct: int | None = None
    distinct_exact: bool | None = None  # False: HyperLogLog estimate, within 2%
    top: tuple = ()  # ValueCount, most frequent first (ties: larger value first), up to 1,000
    top_exact: bool | None = None  # False: frequent-items estimates (no false positives)
    length: Lengths | None = None  # text and bytes values
    list_length: Lengths | None = None  # list features

    @property
    def variance(self) -> float | None:
        return None if self.std is None else self.std * self.std

    @property
    def vocabulary(self) -> list | None:
        """Every distinct value, most frequent first, if the statistics hold them all exactly."""
        if self.distinct_exact and self.top_exact and self.distinct == len(self.top):
            return [v.value for v in self.top]
        return None

    def quantile(self, q: float) -> float:
        """The value at rank `q` in [0, 1], interpolated between the recorded percentiles."""
        if not self.quantiles:
            raise ValueError("this feature has no quantiles (not a number, or no finite values)")
        if not 0 <= q <= 1:
            raise ValueError(f"quantile rank must be in [0, 1], got {q}")
        at = q * (len(self.quantiles) - 1)
        lo = int(at)
        hi = min(lo + 1, len(self.quantiles) - 1)
        return self.quantiles[lo] + (self.quantiles[hi] - self.quantiles[lo]) * (at - lo)

    @classmethod
    def from_json(cls, d: Mapping, where: str) -> "FeatureStatistics":
        if not isinstance(d, Mapping):
            raise ValueError(f"{where} must be an object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; known keys: {sorted(known)}")
        for key in ("count", "missing"):
            if not isinstance(d.get(key), int) or d[key] < 0:
                raise ValueError(f"{where}.{key} must be a non-negative integer, got {d.get(key)!r}")
        out = dict(d)
        out["quantiles"] = tuple(d.get("quantiles") or ())
        try:
            out["top"] = tuple(ValueCount(t["value"], int(t["count"])) for t in d.get("top") or ())
            for key in ("length", "list_length"):
                if d.get(key) is not None:
                    lengths = dict(d[key])
                    lengths["quantiles"] = tuple(lengths.get("quantiles") or ())
                    out[key] = Lengths(**lengths)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where} is malformed: {e}") from e
        return cls(**out)


@dataclasses.dataclass(frozen=True)
class Statistics:
    overall: Mapping  # feature name -> FeatureStatistics
    splits: Mapping  # split name -> {feature name -> FeatureStatistics}

    def of(self, split: str | None = None) -> Mapping:
        """The features' statistics in `split`, or over every split (None)."""
        if split is None:
            return self.overall
        if split not in self.splits:
            raise KeyError(f"no statistics for split {split!r}; splits: {sorted(self.splits)}")
        return self.splits[split]

    def feature(self, name: str, split: str | None = None) -> FeatureStatistics:
        features = self.of(split)
        if name not in features:
            raise KeyError(f"no statistics for feature {name!r}; features: {list(features)}")
        return features[name]

    def to_json(self) -> dict:
        return {
            "overall": {n: _json(s) for n, s in self.overall.items()},
            "splits": {split: {n: _json(s) for n, s in f.items()} for split, f in self.splits.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping, where: str = "metadata.statistics") -> "Statistics":
        if not isinstance(d, Mapping) or not isinstance(d.get("overall"), Mapping):
            raise ValueError(f"{where} must be an object with 'overall' and 'splits'")
        splits = d.get("splits") or {}
        return cls(
            overall={n: FeatureStatistics.from_json(s, f"{where}.overall.{n}") for n, s in d["overall"].items()},
            splits={
                split: {n: FeatureStatistics.from_json(s, f"{where}.splits.{split}.{n}") for n, s in f.items()}
                for split, f in splits.items()
            },
        )


def _json(s: FeatureStatistics) -> dict:
    out = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if v is None or v == ():
            continue
        if f.name == "top":
            v = [{"value": t.value, "count": t.count} for t in v]
        elif isinstance(v, Lengths):
            v = {k: list(x) if isinstance(x, tuple) else x for k, x in dataclasses.asdict(v).items() if x != ()}
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out
