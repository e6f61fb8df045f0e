"""`compare`: drift between two datasets, from the statistics recorded at conversion alone.

As TensorFlow Data Validation measures it, feature by feature, with no pass over the records:

    numeric      Jensen-Shannon divergence (base 2, 0 = same, 1 = disjoint) between the
                 histograms the two sides' 101 recorded percentiles describe
    categorical  L-infinity distance between the value frequencies (the largest change in
                 any one value's share of the values)
    both         the change in the share of records missing the feature

    report = compare("gs://bucket/ds-2024-05", "gs://bucket/ds-2024-06")
    print(report)  # a table, worst first
    report.drifted  # ("wind", ...)
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping

import numpy as np

from ingest import contract
from ingest.names import nearest
from ingest.statistics import ONE_HOT_MAX, FeatureStatistics, Statistics

__all__ = ["compare", "DriftReport", "DriftRow", "jensen_shannon", "l_infinity", "records_needed"]

# Defaults measured on Seattle's daily weather 2012-2015 (vega_datasets' seattle-weather.csv,
# 1,461 days; docs/drift.md has the whole table): the largest distance seen where nothing
# changed, against the smallest where something did.
#   numeric JS      random halves 0.016 (200 seeds), random quarters 0.031, one year against
#                   another 0.037 | temp_max, temp_min or wind x1.5: 0.145; Jan vs Jul temp 1.0
#   categorical L∞  weather, halves 0.077, quarters 0.088 | summer vs winter months 0.44
#   missing share   halves with wind blanked in 50% of days 0.062 | 20% more days blanked 0.20
# Each threshold is about twice the noise and half the shift.
NUMERIC_THRESHOLD = 0.07
CATEGORICAL_THRESHOLD = 0.15
MISSING_THRESHOLD = 0.1

# Sampling noise on the same data, the largest seen over every feature and seed, times the
# power of the records that cancels its fall: JS falls as 1/n, the L-infinity distance and a
# missing share as 1/sqrt(n), where n is the effective records of the two sides (1/n =
# 1/baseline + 1/current: 365 for halves of 730 days, 182.5 for quarters).
#   JS          halves 0.016 x 365 = 5.8, quarters 0.031 x 182.5 = 5.7
#   L-infinity  halves 0.077 x sqrt(365) = 1.47, quarters 0.088 x sqrt(182.5) = 1.19
#   missing     wind blanked on half the days (the largest spread, p = 0.5), 0.062 x sqrt(365) = 1.18
# A threshold t tells drift from noise above NOISE_JS / t records, or (NOISE_SHARE / t)^2:
# with the defaults 83 (JS), 96 (L-infinity) and 139 (a missing share near 50%).
NOISE_JS = 5.8
NOISE_L_INFINITY = 1.47
NOISE_MISSING = 1.18

# Bins of the histograms JS compares, each an equal share of the two sides pooled: the
# distance does not change when a feature is rescaled (and barely when it is logged), and an
# outlier does not squeeze the rest into one bin. 10, as TFDV's histograms: on the data
# above, the x1.5 shifts measured 9x the halves' noise with 10 bins, 5x with 20 (0.150
# against 0.029).
BINS = 10


@dataclasses.dataclass(frozen=True)
class DriftRow:
    """One feature's comparison.

    `kind` is "numeric", "categorical", "bytes" (binary values: only the missing share is
    compared) or "schema" (the feature is on one side only, or its type changed);
    `metric` "jensen_shannon", "l_infinity" or None; `distance` None when there was nothing
    to compare (no values on a side). `missing_baseline` and `missing_current` are the
    shares of records without the feature (None: the side has no such feature, or no records).
    """

    feature: str
    kind: str
    metric: str | None
    distance: float | None
    threshold: float | None
    missing_baseline: float | None
    missing_current: float | None
    drifted: bool
    note: str = ""
    # Categories in the current dataset that the baseline has none of, most frequent first
    # (as recorded: the label's class ids, text values): only where the baseline's
    # statistics hold every one of its values exactly, so that absent means absent.
    new_values: tuple = ()

    @property
    def missing_change(self) -> float | None:
        if self.missing_baseline is None or self.missing_current is None:
            return None
        return abs(self.missing_current - self.missing_baseline)


@dataclasses.dataclass(frozen=True)
class DriftReport:
    """What `compare` found: one row per feature, worst first (drifted ones before the rest).

    `str(report)` is an aligned table; `report.plot(path)` draws the worst features.
    """

    rows: tuple
    baseline: str  # what was compared: the path(s), or "statistics"
    current: str
    split: str | None
    missing_threshold: float
    # The two sides' {feature: FeatureStatistics}: what `plot` draws.
    statistics: tuple = dataclasses.field(default=({}, {}), repr=False, compare=False)
    current_split: str | None = None  # the current side's split, where it is not `split`
    baseline_records: int | None = None  # records in the statistics compared (None: not given)
    current_records: int | None = None
    # Why the distances may mean little (a side too small for the thresholds), one line each.
    warnings: tuple = ()

    @property
    def where(self) -> str:
        """Which splits were compared, in words."""

        def named(split):
            return f"split {split!r}" if split else "all splits"

        if self.current_split is None or self.current_split == self.split:
            return named(self.split)
        return f"{named(self.current_split)} against {named(self.split)}"

    @property
    def drifted(self) -> tuple:
        """The features beyond their threshold, worst first."""
        return tuple(r.feature for r in self.rows if r.drifted)

    def row(self, feature: str) -> DriftRow:
        for r in self.rows:
            if r.feature == feature:
                return r
        raise KeyError(f"no feature {feature!r} in this report; features: {[r.feature for r in self.rows]}")

    def __str__(self) -> str:
        drifted = self.drifted
        head = (
            f"{self.current} (current) against {self.baseline} (baseline), {self.where}: "
            f"{len(self.rows)} features, {len(drifted)} drifted (missing share threshold {self.missing_threshold:g})"
        )
        columns = ["feature", "kind", "metric", "distance", "threshold", "missing", "drifted", "note"]
        cells = [
            [
                r.feature,
                r.kind,
                r.metric or "",
                "" if r.distance is None else f"{r.distance:.4f}",
                "" if r.threshold is None else f"{r.threshold:g}",
                f"{_share(r.missing_baseline)} -> {_share(r.missing_current)}",
                "DRIFT" if r.drifted else "",
                r.note,
            ]
            for r in self.rows
        ]
        numeric = {"distance", "threshold"}
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

        def line(values):
            text = "  ".join(v.rjust(w) if c in numeric else v.ljust(w) for c, v, w in zip(columns, values, widths))
            return text.rstrip()

        records = f"records: {_count(self.baseline_records)} baseline, {_count(self.current_records)} current"
        notes = [f"warning: {w}" for w in self.warnings]
        return "\n".join([head, records, *notes, "", line(columns), *(line(row) for row in cells)])

    def plot(self, path: str, *, features: int = 6) -> int:
        """Writes a PNG of the worst `features` (up to 6 by default): for numbers the two
        sides' histograms overlaid, for categories their top values' shares side by side.
        Returns how many were drawn. Needs matplotlib (`pip install 'ingest[plot]'`)."""
        return _plot(self, path, features)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


# --- distances: pure functions of the recorded statistics -------------------------------


def _cdf(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The share of values <= x (right-continuous) that the percentiles `q` describe: linear
    between distinct percentiles, with a jump where several are equal (a point mass)."""
    n = len(q)
    ranks = np.linspace(0.0, 1.0, n)
    at_or_below = np.searchsorted(q, x, side="right")
    i0, i1 = np.clip(at_or_below - 1, 0, n - 1), np.clip(at_or_below, 0, n - 1)
    span = q[i1] - q[i0]
    t = np.divide(x - q[i0], span, out=np.zeros_like(x, dtype=float), where=span > 0)
    cdf = ranks[i0] + t * (ranks[i1] - ranks[i0])
    return np.where(at_or_below == 0, 0.0, np.where(at_or_below >= n, 1.0, cdf))


def _cdf_below(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The share of values < x: as `_cdf`, less the point mass at x."""
    first = np.searchsorted(q, x, side="left")
    return np.where(np.isin(x, q), first / (len(q) - 1), _cdf(q, x))


def _pooled_edges(quantiles: list, bins: int) -> np.ndarray:
    """Right edges of `bins` bins holding equal shares of the sides pooled (fewer where a
    point mass spans several shares: it stays whole in one bin); the last edge is the largest
    value, and the first bin holds the smallest value too."""
    knots = np.unique(np.concatenate(quantiles))
    above = np.mean([_cdf(q, knots) for q in quantiles], axis=0)  # pooled share <= knot
    below = np.mean([_cdf_below(q, knots) for q in quantiles], axis=0)  # < knot
    p = np.arange(1, bins) / bins
    i = np.searchsorted(above, p, side="left")  # the first knot the share reaches p at
    in_jump = below[i] < p
    prev = np.maximum(i - 1, 0)
    rise = below[i] - above[prev]
    t = np.divide(p - above[prev], rise, out=np.ones_like(p), where=rise > 0)
    inner = np.where(in_jump, knots[i], knots[prev] + t * (knots[i] - knots[prev]))
    return np.unique(np.append(inner, knots[-1]))


def _binned(q: np.ndarray, right_edges: np.ndarray) -> np.ndarray:
    """The share of values in each bin (previous edge, edge]; the first bin from the minimum."""
    return np.diff(_cdf(q, right_edges), prepend=0.0)


def _values(s: FeatureStatistics) -> int:
    """Values present: every element for list features."""
    return s.values if s.values is not None else s.count


def _infinities(s: FeatureStatistics) -> tuple:
    """(-inf count, +inf count). Statistics recorded before -inf was counted apart have
    `neg_inf` None: their `min` and `max` leave infinities out too, so every one counts as +inf."""
    inf = s.inf or 0
    negative = min(s.neg_inf or 0, inf)
    return negative, inf - negative


def numeric_histograms(a: FeatureStatistics, b: FeatureStatistics, *, bins: int = BINS):
    """The two sides' shares of values in common bins (pooled equal shares, see `BINS`),
    then a NaN bin, a -inf bin and a +inf bin; None when a side has no values."""
    if not _values(a) or not _values(b):
        return None
    quantiles = [np.asarray(s.quantiles, float) for s in (a, b) if s.quantiles]
    edges = _pooled_edges(quantiles, bins) if quantiles else np.array([])
    out = []
    for s in (a, b):
        total = _values(s)
        nan = (s.nan or 0) / total
        negative, positive = (n / total for n in _infinities(s))
        share = 1 - nan - negative - positive
        finite = _binned(np.asarray(s.quantiles, float), edges) * share if s.quantiles else 0 * edges
        out.append(np.concatenate([finite, [nan, negative, positive]]))
    return out[0], out[1]


def jensen_shannon(p, q) -> float:
    """Jensen-Shannon divergence in bits between two histograms (normalized here): 0 for
    the same shares, 1 when no bin holds values of both."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(x):
        held = x > 0
        return float(np.sum(x[held] * np.log2(x[held] / m[held])))

    return min(1.0, max(0.0, (kl(p) + kl(q)) / 2))


def frequencies(s: FeatureStatistics) -> dict:
    """{value: share of the values} over the recorded top values."""
    total = _values(s)
    return {t.value: t.count / total for t in s.top} if total else {}


def l_infinity(a: Mapping, b: Mapping) -> float:
    """The largest difference of one value's share; a value one side lacks has share 0 there."""
    return max((abs(a.get(v, 0.0) - b.get(v, 0.0)) for v in set(a) | set(b)), default=0.0)


def _truncated(s: FeatureStatistics) -> bool:
    """Whether the top list leaves values out, or holds estimates."""
    return not s.top_exact or s.distinct is None or s.distinct > len(s.top)


def _missing(s: FeatureStatistics) -> float | None:
    records = s.count + s.missing
    return s.missing / records if records else None


# --- which comparison a feature gets ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Side:
    """One dataset as compare sees it."""

    name: str  # for messages and the report: the path(s), or "statistics"
    stats: Mapping  # {feature: FeatureStatistics}
    specs: Mapping  # {feature: FeatureSpec}; empty when given bare Statistics
    class_named: str | None  # the label feature, when the dataset records class names
    split: str | None  # the split compared (None: all of them)
    others: Mapping  # {split: records} of the splits that hold records, for the empty-split error

    @property
    def records(self) -> int:
        """Records in the split compared: every record counts once, with a feature or missing it."""
        return max((s.count + s.missing for s in self.stats.values()), default=0)


def _base_kind(spec: contract.FeatureSpec | None, s: FeatureStatistics) -> str | None:
    """The kind, "number", "text" or "bytes": from the schema, or without one from the
    statistics' fields; None when neither tells (no schema, no values)."""
    if spec is not None:
        return "number" if spec.dtype != "bytes" else "text" if spec.text else "bytes"
    if s.zeros is not None or s.quantiles or s.mean is not None:
        return "number"
    if not _values(s):
        return None
    return "text" if s.top else "bytes"


def _few_values(s: FeatureStatistics) -> bool:
    vocabulary = s.vocabulary
    return vocabulary is not None and len(vocabulary) <= ONE_HOT_MAX


def _schema_change(a: contract.FeatureSpec | None, b: contract.FeatureSpec | None) -> str:
    if a is None or b is None:
        return ""
    changes = [
        f"{what} {x} -> {y}"
        for what, x, y in (("dtype", a.dtype, b.dtype), ("shape", a.shape, b.shape), ("text", a.text, b.text))
        if x != y and not (what == "dtype" and _float_widths(a, b))
    ]
    return "schema: " + ", ".join(changes) if changes else ""


def _float_widths(a: contract.FeatureSpec | None, b: contract.FeatureSpec | None) -> str:
    """A note when one side's floats are float32 and the other's float64, else "": the same
    numbers (a day whose values float32 would change is float64, `conversion.md`), so they
    are compared as numbers, not as a schema change."""
    if a is None or b is None or a.dtype == b.dtype or {a.dtype, b.dtype} != set(contract.FLOAT_DTYPES):
        return ""
    return f"dtype {a.dtype} -> {b.dtype}"


@dataclasses.dataclass(frozen=True)
class _Limits:
    numeric: float
    categorical: float
    missing: float


def _compare_feature(name, base: _Side, cur: _Side, limits: _Limits, own: float | None) -> tuple:
    """(row, severity): `own` is the feature's threshold, if given; severity is how far past
    its threshold the worst measure is (inf for a schema difference), for sorting."""
    a, b = base.stats.get(name), cur.stats.get(name)
    missing = (None if a is None else _missing(a), None if b is None else _missing(b))
    if a is None or b is None:
        side = "current" if a is None else "baseline"
        row = DriftRow(name, "schema", None, None, None, *missing, True, f"only in the {side} dataset")
        return row, math.inf
    spec_a, spec_b = base.specs.get(name), cur.specs.get(name)
    kind_a, kind_b = _base_kind(spec_a, a), _base_kind(spec_b, b)
    if kind_a and kind_b and kind_a != kind_b:
        note = f"a {kind_a} feature in the baseline, {kind_b} in the current dataset"
        return DriftRow(name, "schema", None, None, None, *missing, True, note), math.inf
    kind_a = kind_a or kind_b or "bytes"  # a side without values takes the other's kind
    schema = _schema_change(spec_a, spec_b)
    notes = [note for note in (schema, _float_widths(spec_a, spec_b)) if note]
    distance = metric = threshold = None
    new_values = ()
    if kind_a == "bytes":
        kind = "bytes"
        notes.append("binary values: only the missing share is compared")
    elif kind_a == "text" or name in (base.class_named, cur.class_named) or (_few_values(a) and _few_values(b)):
        kind, metric, threshold = "categorical", "l_infinity", limits.categorical
        if _values(a) and _values(b):
            distance = l_infinity(frequencies(a), frequencies(b))
            if _truncated(a) or _truncated(b):
                shown = max(len(a.top), len(b.top))
                notes.append(f"over the {shown:,} most frequent values recorded")
            new_values = _new_values(a, b)
            if new_values:
                notes.append(_new_note(new_values, b))
    else:
        kind, metric, threshold = "numeric", "jensen_shannon", limits.numeric
        histograms = numeric_histograms(a, b)
        if histograms is not None:
            distance = jensen_shannon(*histograms)
    if own is not None and threshold is not None:
        threshold = own
    if distance is None and metric is not None:
        empty = [side for side, s in (("baseline", a), ("current", b)) if not _values(s)]
        notes.append(f"no values in the {' and '.join(empty)} dataset")
    change = None if None in missing else abs(missing[1] - missing[0])
    limit = limits.missing
    if change is not None and change > limit:
        notes.append(f"missing share changed by {change:.2f} > {limit:g}")
    severity = max(
        _over(distance, threshold),
        _over(change, limit),
        math.inf if schema else 0.0,
    )
    drifted = bool(schema) or _past(distance, threshold) or _past(change, limit)
    row = DriftRow(name, kind, metric, distance, threshold, *missing, drifted, "; ".join(notes), new_values)
    return row, severity


_NEW_SHOWN = 5  # new categories named in a row's note; `DriftRow.new_values` holds them all


def _new_values(a: FeatureStatistics, b: FeatureStatistics) -> tuple:
    """The current side's recorded values the baseline has none of, most frequent first; ()
    when the baseline's statistics leave values out or estimate them (absent would not mean
    absent)."""
    if a.vocabulary is None:
        return ()
    known = set(a.vocabulary)
    return tuple(t.value for t in b.top if t.value not in known)


def _new_note(new_values: tuple, b: FeatureStatistics) -> str:
    share = dict(frequencies(b))
    named = ", ".join(f"{v!r} {100 * share[v]:.1f}%" for v in new_values[:_NEW_SHOWN])
    more = f" and {len(new_values) - _NEW_SHOWN:,} more" if len(new_values) > _NEW_SHOWN else ""
    at_least = "at least " if _truncated(b) else ""
    return f"{at_least}{len(new_values):,} new in the current dataset: {named}{more}"


def _past(value, threshold) -> bool:
    return value is not None and threshold is not None and value > threshold


def _over(value, threshold) -> float:
    if value is None or threshold is None:
        return 0.0
    if threshold == 0:
        return math.inf if value > 0 else 0.0
    return value / threshold


# --- whether the sides are large enough for the thresholds -----------------------------


def records_needed(row: DriftRow, missing_threshold: float, missing_share: float) -> tuple:
    """(records, which threshold): the effective records (1/n = 1/baseline + 1/current) above
    which sampling noise stays under `row`'s thresholds (see NOISE_JS), its distance's and
    the missing share's at the pooled share `missing_share` (noise grows with its spread,
    and there is none when nothing is missing)."""
    need = (0.0, "")
    if row.distance is not None and row.threshold:
        if row.metric == "jensen_shannon":
            need = (NOISE_JS / row.threshold, f"the numeric threshold {row.threshold:g}")
        else:
            need = ((NOISE_L_INFINITY / row.threshold) ** 2, f"the categorical threshold {row.threshold:g}")
    spread = 2 * math.sqrt(missing_share * (1 - missing_share))  # 1 at a 50% share
    if missing_threshold and spread:
        missing = (NOISE_MISSING * spread / missing_threshold) ** 2
        need = max(need, (missing, f"the missing share threshold {missing_threshold:g} ({row.feature})"))
    return need


def _too_small(rows, missing_threshold: float, baseline: int, current: int) -> tuple:
    """One warning when the sides are too small for the thresholds' distances to tell drift from noise."""
    if not baseline or not current:
        return ()
    effective = 1 / (1 / baseline + 1 / current)
    needs = []
    for r in rows:
        if r.missing_baseline is None or r.missing_current is None:
            share = 0.0
        else:
            share = (r.missing_baseline * baseline + r.missing_current * current) / (baseline + current)
        needs.append(records_needed(r, missing_threshold, share))
    need, which = max(needs, default=(0.0, ""))
    if effective >= need:
        return ()
    return (
        f"too few records for these thresholds: {baseline:,} baseline and {current:,} current count as "
        f"{effective:,.0f} (1/n = 1/baseline + 1/current), and below about {math.ceil(need):,} sampling noise "
        f"alone reaches {which}: drifted features here may be noise. Compare more records (a week of spans "
        "against the weeks before), or raise the thresholds (docs/drift.md, Small samples)",
    )


# --- the entry point --------------------------------------------------------------------


def _side(x, which: str, split: str | None) -> _Side:
    if isinstance(x, Statistics):
        info, name = None, "statistics"
        statistics = x
    else:
        if isinstance(x, contract.DatasetInfo):
            info, name = x, "DatasetInfo"
        elif isinstance(x, (str, os.PathLike, list, tuple)):
            from ingest.metadata import _info

            info = _info.load_info(x)  # a list or a glob: spans, their statistics merged
            name = ", ".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)
        else:
            raise TypeError(
                f"{which} must be a dataset path, a list of paths, a DatasetInfo or a Statistics, "
                f"got {type(x).__name__}"
            )
        statistics = info.statistics
        if statistics is None:
            raise ValueError(
                f"{which} {name} has no statistics: it was converted with --no_statistics or by an older "
                "ingest. Reconvert it without --no_statistics to compare it"
            )
    if split is not None and split not in statistics.splits:
        raise ValueError(f"{which} {name} has no statistics for split {split!r}; splits: {sorted(statistics.splits)}")
    specs = {} if info is None else {f.name: f for f in info.features}
    class_named = info.label if info is not None and info.labels else None
    others = {n: _Side(name, statistics.of(n), {}, None, n, {}).records for n in statistics.splits}
    return _Side(name, statistics.of(split), specs, class_named, split, {n: r for n, r in others.items() if r})


def _check_not_empty(side: _Side, which: str) -> None:
    """An empty split has no statistics to compare: every feature would read as missing on that side."""
    if side.records:
        return
    what = f"{which} split {side.split!r} of {side.name}" if side.split else f"{which} {side.name}"
    held = ", ".join(f"{n} ({r:,})" for n, r in side.others.items()) or "none"
    raise ValueError(
        f"{what} is empty (0 records): there is nothing to compare. "
        f"Splits with records: {held}; pick one with --split/--current_split (split=, current_split=)"
    )


def _check_threshold(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1] (every distance is), got {value!r}")
    return float(value)


def compare(
    baseline,
    current,
    *,
    split: str | None = "train",
    current_split: str | None = None,
    thresholds: Mapping | None = None,
    numeric_threshold: float = NUMERIC_THRESHOLD,
    categorical_threshold: float = CATEGORICAL_THRESHOLD,
    missing_threshold: float = MISSING_THRESHOLD,
) -> DriftReport:
    """How far `current` drifted from `baseline`, feature by feature, from the statistics
    recorded at conversion (no record is read).

    Numbers are compared by the Jensen-Shannon divergence of their histograms (from the
    recorded percentiles), text features and int features of at most 100 values (every
    value recorded on both sides) by the L-infinity distance of their value frequencies,
    and every feature by the change in its share of missing records. A feature drifted when
    a distance is above its threshold, or when it is on one side only, or its type changed.

    Args:
      baseline: the reference: a converted dataset's path (local or gs://), a list of
        paths, a `DatasetInfo` or a `Statistics`.
      current: the data to check, in the same forms.
      split: whose statistics to compare; None for all splits together.
      current_split: the current side's split, when it is another (e.g. "eval" against a
        baseline's "train", or a dataset against itself); by default `split`.
      thresholds: {feature: threshold} replacing the numeric or categorical threshold for
        those features (1 never flags the distance; the missing share still counts).
      numeric_threshold: the largest Jensen-Shannon divergence (0 to 1) that is not drift.
      categorical_threshold: the largest L-infinity distance (0 to 1) that is not drift.
      missing_threshold: the largest change in the share of records missing a feature.

    Returns:
      A `DriftReport`: `.drifted` names the features that drifted, worst first; `.rows`
      has every feature's figures; print it for a table, `.plot(path)` for a PNG.
    """
    limits = _Limits(
        numeric=_check_threshold("numeric_threshold", numeric_threshold),
        categorical=_check_threshold("categorical_threshold", categorical_threshold),
        missing=_check_threshold("missing_threshold", missing_threshold),
    )
    other = split if current_split is None else current_split
    base, cur = _side(baseline, "baseline", split), _side(current, "current", other)
    _check_not_empty(base, "baseline")
    _check_not_empty(cur, "current")
    names = list(base.stats) + [n for n in cur.stats if n not in base.stats]
    thresholds = dict(thresholds or {})
    unknown = [n for n in thresholds if n not in names]
    if unknown:
        near = nearest(unknown[0], names)
        raise ValueError(
            f"thresholds name feature(s) {unknown} that neither dataset has; features: {names}"
            + (f"; {unknown[0]!r}: did you mean {near!r}?" if near else "")
        )
    own = {n: _check_threshold(f"thresholds[{n!r}]", v) for n, v in thresholds.items()}
    results = [_compare_feature(n, base, cur, limits, own.get(n)) for n in names]
    order = sorted(range(len(results)), key=lambda i: (not results[i][0].drifted, -results[i][1], i))
    rows = tuple(results[i][0] for i in order)
    warnings = _too_small(rows, limits.missing, base.records, cur.records)
    return DriftReport(
        rows=rows,
        baseline=base.name,
        current=cur.name,
        split=split,
        missing_threshold=limits.missing,
        statistics=(base.stats, cur.stats),
        current_split=None if other == split else other,
        baseline_records=base.records,
        current_records=cur.records,
        warnings=warnings,
    )


# --- the picture ---------------------------------------------------------------------------

_PLOT_BINS = 30  # bars per numeric panel, as `ingest describe` draws them
_PLOT_VALUES = 8  # values per categorical panel: more make the labels unreadable
_COLORS = ("#4878a8", "#d08838")  # baseline, current
_SYMBOLS = {"jensen_shannon": "JS", "l_infinity": "L∞"}


def _plot(report: DriftReport, path: str, features: int) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in report.rows if r.distance is not None][:features]
    if not shown:
        raise ValueError("nothing to plot: no feature has values on both sides to compare")
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    base, cur = report.statistics
    for ax, r in zip(axes.flat, shown):
        a, b = base[r.feature], cur[r.feature]
        if r.kind == "numeric":
            _numeric_panel(ax, a, b)
        else:
            _categorical_panel(ax, a, b)
        verdict = ">" if r.distance > r.threshold else "≤"
        title = f"{r.feature}: {_SYMBOLS[r.metric]} {r.distance:.3f} {verdict} {r.threshold:g}"
        if r.missing_change and r.missing_change > report.missing_threshold:
            title += f"\nmissing {_share(r.missing_baseline)} → {_share(r.missing_current)}"
        ax.set_title(title, fontsize=10, color="#b02020" if r.drifted else "black")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"baseline {report.baseline} vs current {report.current} ({report.where})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))  # room for the title
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return len(shown)


def _numeric_panel(ax, a: FeatureStatistics, b: FeatureStatistics) -> None:
    """Both sides' finite values in the same equal-width bars (a point mass: one tall bar)."""
    sides = [(np.asarray(s.quantiles, float), label) for s, label in ((a, "baseline"), (b, "current"))]
    lo = min(q[0] for q, _ in sides if len(q))
    hi = max(q[-1] for q, _ in sides if len(q))
    edges = np.linspace(lo, hi if hi > lo else lo + 1, _PLOT_BINS + 1)
    for (q, label), color in zip(sides, _COLORS):
        if len(q):
            share = 100 * _binned(q, edges[1:])
            ax.stairs(share, edges, fill=True, alpha=0.35, color=color)
            ax.stairs(share, edges, color=color, label=label)
    ax.set_ylabel("% of values")


def _categorical_panel(ax, a: FeatureStatistics, b: FeatureStatistics) -> None:
    """The values with the largest share on either side, both sides' shares side by side."""
    fa, fb = frequencies(a), frequencies(b)
    values = sorted(set(fa) | set(fb), key=lambda v: (-max(fa.get(v, 0.0), fb.get(v, 0.0)), str(v)))
    values = values[:_PLOT_VALUES]
    values = values[::-1]  # barh draws bottom-up
    y = np.arange(len(values))
    ax.barh(y + 0.2, [100 * fa.get(v, 0.0) for v in values], 0.4, color=_COLORS[0], label="baseline")
    ax.barh(y - 0.2, [100 * fb.get(v, 0.0) for v in values], 0.4, color=_COLORS[1], label="current")
    ax.set_yticks(y, [_short(v) for v in values], fontsize=8)
    ax.set_xlabel("% of values")


def _short(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 18 else text[:17] + "…"
