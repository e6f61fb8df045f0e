"""The statistics a conversion records, as typed objects (`DatasetInfo.statistics`).

In `dataset_info.json` they sit under "statistics": {"overall": {feature: {...}},
"splits": {split: {feature: {...}}}}, one object per feature with the field names below.
Numbers are over the values present (list features: every element); `mean`, `std` and
`quantiles` leave out NaN and infinities, which `nan` and `inf` count (`neg_inf` those
of them that are -inf); `min` and `max` leave out NaN only: -inf or +inf when there is one.
Pure Python: Beam workers read it without TensorFlow.

The file is strict JSON (RFC 8259), which has no infinity or NaN: a number that is not
finite is written as the string "Infinity", "-Infinity" or "NaN", protobuf's JSON mapping
of float fields, and read back as a float. (Metadata written before held them as bare
`Infinity` tokens, which Python reads and JavaScript's and Go's parsers refuse; it still
loads.) Every field is type-checked on load, naming the feature and the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

__all__ = ["ValueCount", "Lengths", "FeatureStatistics", "Statistics", "json_number", "number_of"]

# Text and int features with at most this many values are categories: `feature_space` makes
# them one-hot lookups, a block of that many columns (past it, one-hot makes the output as
# wide as the vocabulary: 105 airports, 26k e-mails, so text becomes ids for an embedding),
# and `compare` tests their drift as categories. Here, below both, so they agree.
ONE_HOT_MAX = 100

# Strict JSON's spelling of the numbers it has none for (protobuf's JSON mapping).
_NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def json_number(x):
    """A number as strict JSON holds it: as it is if finite, else "Infinity", "-Infinity" or "NaN"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def number_of(value, where: str, *, finite: bool = False, minimum: float | None = None):
    """A number read from the metadata (a non-finite one from its string), or a ValueError
    saying where it is and what was found. `finite`: only finite numbers are valid."""
    if isinstance(value, str) and value in _NON_FINITE and not finite:
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        spelled = "a finite number" if finite else 'a number (or "Infinity", "-Infinity", "NaN")'
        raise ValueError(f"{where} must be {spelled}, got {_shown(value)}")
    if finite and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where} must be at least {minimum}, got {value!r}")
    return value


def _shown(value) -> str:
    kind = {
        str: "a string",
        list: "a list",
        dict: "an object",
        bool: "true or false",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }
    return f"{kind.get(type(value), type(value).__name__)} {value!r:.80}"


def _count(d: Mapping, key: str, where: str, *, required: bool = False):
    value = d.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}.{key} must be a non-negative integer, got {_shown(value)}")
    return value


def _number_list(value, where: str, *, finite: bool = False) -> tuple:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of numbers, got {_shown(value)}")
    return tuple(number_of(x, f"{where}[{i}]", finite=finite) for i, x in enumerate(value))


def _flag(d: Mapping, key: str, where: str):
    value = d.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be true, false or null, got {_shown(value)}")
    return value


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
    neg_inf: int | None = None  # of `inf`, the -inf values (None: recorded before it was counted)
    # text features, int64 features of up to 10,000 distinct values; bytes: `distinct` only
    distinct: int | None = None
    distinct_exact: bool | None = None  # False: an estimate (or, merged spans, a lower bound)
    # An estimate's relative error bound at 99% confidence: |distinct - true count| is at
    # most distinct_error * the true count. None: exact, or no bound recorded (before it was).
    distinct_error: float | None = None
    top: tuple = ()  # ValueCount, most frequent first (ties: larger value first), up to 1,000
    # False: frequent-items estimates (no false positives), or a text value over 256 characters
    # stored cut (its first 255 and '…'): no vocabulary then
    top_exact: bool | None = None
    # Estimated counts' bound: each `top` count is at least its true count and at most
    # top_error above it (certain, not a probability). None: exact, or not recorded.
    top_error: int | None = None
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
        """Parses and type-checks one feature's statistics; a ValueError names `where` and the field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where} must be an object, got {_shown(d)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; known keys: {sorted(known)}")
        out = {key: _count(d, key, where, required=True) for key in ("count", "missing")}
        for key in ("values", "zeros", "nan", "inf", "neg_inf", "distinct", "top_error"):
            out[key] = _count(d, key, where)
        for key in ("min", "max", "mean", "std"):
            if d.get(key) is not None:
                out[key] = number_of(d[key], f"{where}.{key}", minimum=0 if key == "std" else None)
        if d.get("distinct_error") is not None:
            out["distinct_error"] = number_of(d["distinct_error"], f"{where}.distinct_error", finite=True, minimum=0)
        out["quantiles"] = _number_list(d.get("quantiles") or [], f"{where}.quantiles")
        for key in ("distinct_exact", "top_exact"):
            out[key] = _flag(d, key, where)
        top = d.get("top") or []
        if not isinstance(top, list):
            raise ValueError(f"{where}.top must be a list of {{'value', 'count'}}, got {_shown(top)}")
        out["top"] = tuple(_value_count(t, f"{where}.top[{i}]") for i, t in enumerate(top))
        for key in ("length", "list_length"):
            if d.get(key) is not None:
                out[key] = _lengths(d[key], f"{where}.{key}")
        return cls(**out)


def _value_count(t, where: str) -> ValueCount:
    if not isinstance(t, Mapping) or set(t) != {"value", "count"}:
        raise ValueError(f"{where} must be an object with 'value' and 'count', got {_shown(t)}")
    value = t["value"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}.value must be a string (text) or an integer (int64), got {_shown(value)}")
    return ValueCount(value, _count(t, "count", where, required=True))


def _lengths(d, where: str) -> Lengths:
    if not isinstance(d, Mapping):
        raise ValueError(f"{where} must be an object, got {_shown(d)}")
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(Lengths)})
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; known keys: ['max', 'mean', 'min', 'quantiles']")
    mean = d.get("mean")
    return Lengths(
        min=_count(d, "min", where),
        max=_count(d, "max", where),
        mean=None if mean is None else number_of(mean, f"{where}.mean", finite=True, minimum=0),
        quantiles=_number_list(d.get("quantiles") or [], f"{where}.quantiles", finite=True),
    )


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
        if not isinstance(splits, Mapping) or not all(isinstance(f, Mapping) for f in splits.values()):
            raise ValueError(f"{where}.splits must be an object of {{split: {{feature: statistics}}}}")
        return cls(
            overall={n: FeatureStatistics.from_json(s, f"{where}.overall[{n!r}]") for n, s in d["overall"].items()},
            splits={
                split: {n: FeatureStatistics.from_json(s, f"{where}.splits[{split!r}][{n!r}]") for n, s in f.items()}
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
        elif f.name == "quantiles":
            v = [json_number(x) for x in v]
        elif f.name in ("min", "max", "mean", "std"):
            v = json_number(v)
        out[f.name] = v
    return out


def merge(parts) -> Statistics:
    """The statistics of several datasets' rows together (spans read as one), from theirs.

    Exact where the recorded numbers allow it: counts, missing, min, max, zeros, nan, inf,
    mean and std (Chan's pairwise update), and value counts when every part counted its
    values exactly and completely. Quantiles invert the mixture of the parts' recorded
    distributions (piecewise linear between percentiles, point masses kept): the rank
    error stays within the parts' (under 1%) plus the width of a percentile. Where a part
    stored only its most frequent values or an estimate, the result says so
    (`top_exact`/`distinct_exact` False; `distinct` is then the largest lower bound known).
    """
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    names = list(dict.fromkeys(n for p in parts for n in p.overall))
    splits = list(dict.fromkeys(s for p in parts for s in p.splits))
    return Statistics(
        overall={n: _merged_feature([p.overall[n] for p in parts if n in p.overall]) for n in names},
        splits={
            split: {
                n: _merged_feature([p.splits[split][n] for p in parts if n in p.splits.get(split, {})])
                for n in names
                if any(n in p.splits.get(split, {}) for p in parts)
            }
            for split in splits
        },
    )


def _sum(values):
    return None if any(v is None for v in values) else sum(values)


def _present(values):
    return [v for v in values if v is not None]


def _numbers(s: FeatureStatistics) -> int:
    """How many finite numbers `s`'s mean, std and quantiles are over."""
    return (s.values if s.values is not None else s.count) - (s.nan or 0) - (s.inf or 0)


def _merged_feature(parts: list) -> FeatureStatistics:
    if len(parts) == 1:
        return parts[0]
    out = {"count": sum(p.count for p in parts), "missing": sum(p.missing for p in parts)}
    out["values"] = _sum([p.values for p in parts])
    numeric = [p for p in parts if p.mean is not None]
    if numeric:
        n = [_numbers(p) for p in numeric]
        total = sum(n)
        mean = sum(k * p.mean for k, p in zip(n, numeric)) / total
        m2 = sum(k * (p.std or 0.0) ** 2 + k * (p.mean - mean) ** 2 for k, p in zip(n, numeric))
        out.update(
            mean=mean,
            std=(m2 / total) ** 0.5,
            quantiles=_mixture_quantiles([p.quantiles for p in numeric], n, integer=_all_int(numeric)),
        )
    bounded = [p for p in parts if p.min is not None]  # with a mean, or infinities only
    if bounded:
        out.update(min=min(p.min for p in bounded), max=max(p.max for p in bounded))
    for key in ("zeros", "nan", "inf", "neg_inf"):
        present = _present([getattr(p, key) for p in parts])
        if present:
            out[key] = sum(present)
    if out.get("neg_inf") is not None and any(p.inf and p.neg_inf is None for p in parts):
        del out["neg_inf"]  # a part recorded before -inf was counted: the sum would be short
    out.update(_merged_counts(parts))
    for key in ("length", "list_length"):
        lengths = [(getattr(p, key), p.values if key == "length" and p.values else p.count) for p in parts]
        lengths = [(ln, w) for ln, w in lengths if ln is not None and ln.min is not None]
        if lengths:
            out[key] = _merged_lengths(lengths)
    return FeatureStatistics(**{k: v for k, v in out.items() if v is not None})


def _all_int(parts) -> bool:
    return all(isinstance(v, int) for p in parts for v in p.quantiles)


def _merged_lengths(parts: list) -> Lengths:
    total = sum(w for _, w in parts)
    quantiles = ()
    if all(ln.quantiles for ln, _ in parts):
        quantiles = _mixture_quantiles([ln.quantiles for ln, _ in parts], [w for _, w in parts], integer=True)
    return Lengths(
        min=min(ln.min for ln, _ in parts),
        max=max(ln.max for ln, _ in parts),
        mean=sum(ln.mean * w for ln, w in parts) / total if total else None,
        quantiles=quantiles,
    )


def _merged_counts(parts: list) -> dict:
    """distinct and top of the parts' values together."""
    if all(p.distinct is None for p in parts):
        return {}
    complete = all(p.top_exact and p.distinct_exact and p.distinct == len(p.top) for p in parts)
    counts: dict = {}
    for p in parts:
        for t in p.top:
            counts[t.value] = counts.get(t.value, 0) + t.count
    out = {}
    if any(p.top for p in parts):
        # Most frequent first; ties: the larger value first, as the conversion orders them.
        ranked = sorted(counts.items(), key=lambda vc: (vc[1], vc[0]), reverse=True)
        out["top"] = tuple(ValueCount(v, c) for v, c in ranked[:_TOP_STORED])
        out["top_exact"] = complete and len(ranked) <= _TOP_STORED
    if complete:
        out.update(distinct=len(counts), distinct_exact=True)
    else:
        out.update(distinct=max([len(counts)] + [p.distinct or 0 for p in parts]), distinct_exact=False)
    return out


_TOP_STORED = 1_000  # as the conversion stores (beam_jobs.stats.features.TOP_STORED)


def _mixture_quantiles(quantiles: list, weights: list, *, integer: bool) -> tuple:
    """Evenly spaced quantiles of the mixture of distributions given by theirs.

    Each part's distribution function rises linearly between its consecutive distinct
    quantiles and jumps at a repeated one (a point mass); the mixture is their weighted
    sum, which is linear between the union of their points: inverted there exactly.
    """
    import numpy as np

    qs = [np.asarray(q, np.float64) for q, w in zip(quantiles, weights) if len(q) and w > 0]
    ws = np.asarray([w for q, w in zip(quantiles, weights) if len(q) and w > 0], np.float64)
    if not qs:
        return ()
    count = len(quantiles[0])
    ws = ws / ws.sum()
    xs = np.unique(np.concatenate(qs))

    def cdf(x, side):
        total = np.zeros_like(x)
        for q, w in zip(qs, ws):
            ranks = np.linspace(0.0, 1.0, len(q))
            i = np.searchsorted(q, x, side=side)  # quantiles at or below x ("right"), or below it ("left")
            inside = (i > 0) & (i < len(q))
            lo, hi = np.clip(i - 1, 0, len(q) - 1), np.clip(i, 0, len(q) - 1)
            span = np.where(inside, q[hi] - q[lo], 1.0)
            frac = np.where(inside & (span > 0), (x - q[lo]) / np.where(span > 0, span, 1.0), 0.0)
            f = np.where(i >= len(q), 1.0, np.where(i == 0, 0.0, ranks[lo] + frac * (ranks[hi] - ranks[lo])))
            total += w * f
        return total

    at = cdf(xs, "right")  # F(x): the value at each point, after its jump
    before = cdf(xs, "left")  # F(x-): the limit from the left, before the jump
    out = []
    for r in np.linspace(0.0, 1.0, count):
        j = int(np.searchsorted(before, r, side="left"))  # first point whose left limit reaches r
        if j == 0 or r <= 0:
            value = xs[0]
        elif j >= len(xs):
            value = xs[-1]
        elif at[j - 1] >= r:
            value = xs[j - 1]  # r falls in the jump at the previous point
        else:
            lo_f, hi_f = at[j - 1], before[j]
            value = xs[j - 1] + (xs[j] - xs[j - 1]) * (r - lo_f) / (hi_f - lo_f) if hi_f > lo_f else xs[j]
        out.append(value)
    out[0], out[-1] = xs[0], xs[-1]
    return tuple(int(round(v)) for v in out) if integer else tuple(float(v) for v in out)
