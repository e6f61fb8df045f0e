"""`ingest describe`: the statistics recorded at conversion as tables and one PNG.

Reads only the metadata file: no records.
"""

from __future__ import annotations

import math

from ingest import contract
from ingest.statistics import FeatureStatistics

__all__ = ["describe", "plot"]

_TOP_SHOWN = 3  # values per text feature in the table
_VALUE_SHOWN = 40  # characters of a value in the table: a long text would push the table off the screen
_MAX_PANELS = 24  # features plotted; more would make each panel unreadable
_BARS = 10  # values per text panel
_BINS = 30  # bars per number histogram


def _n(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if v != v or abs(v) == math.inf:
            return str(v)
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.3e}"
    return f"{v:,}"


def percent(part: int, total: int) -> str:
    """part/total as a percentage that is never 0% or 100% unless it is: one decimal, or
    rounded up to the first non-zero digit below 0.1% (0.004%)."""
    if total <= 0 or part <= 0:
        return "0%" if total > 0 else ""
    pct = 100 * part / total
    if part >= total:
        return "100%"
    if pct >= 0.1:
        return f"{min(pct, 99.9):.1f}%"  # 99.97% is not 100%
    digits = -math.floor(math.log10(pct))
    return f"{math.ceil(pct * 10**digits) / 10**digits:.{digits}f}%"


def _kind(f: contract.FeatureSpec) -> str:
    base = "text" if f.text else f.dtype
    if f.is_scalar:
        return base
    return f"{base}[{f.shape[0] if f.shape[0] is not None else ''}]"


def _tops(s: FeatureStatistics) -> str:
    total = s.values or s.count
    shown = ", ".join(f"{_shown(t.value)} {percent(t.count, total)}" for t in s.top[:_TOP_SHOWN])
    more = "" if s.distinct is None or s.distinct <= _TOP_SHOWN else ", ..."
    return shown + more


def _estimated(s: FeatureStatistics) -> str:
    """How far `distinct` may be off: nothing when exact, its recorded bound, or "approx."
    (metadata recorded before the bound was, or merged spans)."""
    if s.distinct_exact:
        return ""
    return f" (±{s.distinct_error:.1%})" if s.distinct_error is not None else " (approx.)"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_SHOWN else text[: _VALUE_SHOWN - 1] + "…"


def _cell(value) -> str:
    """A markdown table cell: a `|` in a value (or a name) would end the cell."""
    return str(value).replace("|", "\\|")


def _table(rows: list, columns: list) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def feature_rows(info: contract.DatasetInfo, stats) -> list:
    rows = []
    for f in info.features:
        s = stats.get(f.name)
        if s is None:
            continue
        total = s.count + s.missing
        row = {
            "feature": f.name + (" (label)" if f.name == info.label else ""),
            "type": _kind(f),
            "missing": percent(s.missing, total),
            "min": _n(s.min),
            "mean": _n(s.mean),
            "max": _n(s.max),
            "std": _n(s.std),
        }
        if s.distinct is not None:
            row["distinct"] = f"{s.distinct:,}" + _estimated(s)
            row["top values"] = _tops(s)
        if s.length is not None and s.min is None:
            row["min"], row["mean"], row["max"] = (_n(s.length.min), _n(s.length.mean), _n(s.length.max))
            row["type"] += " (length)"
        if s.nan or s.inf:
            row["std"] += f" ({s.nan} NaN, {s.inf} inf)"
        rows.append(row)
    return rows


def label_rows(info: contract.DatasetInfo, split: str | None = None) -> list:
    """The label's value counts per split (only `split`'s when given), with each split's share."""
    st = info.statistics
    if info.label is None or st is None:
        return []
    splits = [s.name for s in info.splits if info.label in st.splits.get(s.name, {}) and split in (None, s.name)]
    if not splits:
        return []
    per = {split: st.feature(info.label, split) for split in splits}
    overall = st.feature(info.label)
    values = [t.value for t in overall.top]
    rows = []
    for v in values:
        name = _class_name(info, v)
        row = {"label": repr(v if name is None else name)}
        for split, s in per.items():
            count = next((t.count for t in s.top if t.value == v), 0)
            row[split] = f"{count:,} ({100 * count / max(s.count, 1):.1f}%)"
        rows.append(row)
    return rows


def describe(info: contract.DatasetInfo, path: str, split: str | None = None) -> str:
    if info.statistics is None:
        raise ValueError(
            f"{path} has no statistics: it was converted with --no_statistics or by an older ingest; "
            "reconvert it to record them"
        )
    stats = info.statistics.of(split)
    records = {s.name: s.records for s in info.splits}
    out = [
        f"{path}: {sum(records.values()):,} records ("
        + ", ".join(f"{k} {v:,}" for k, v in records.items())
        + f"), {len(info.features)} features, layout {info.layout}, converted {info.created}",
        "",
        f"Features ({'split ' + repr(split) if split else 'all splits'}):",
        "",
    ]
    columns = ["feature", "type", "missing", "min", "mean", "max", "std", "distinct", "top values"]
    if split is not None and not records.get(split):
        held = ", ".join(f"{k} ({v:,})" for k, v in records.items() if v) or "none"
        out[-2:] = (  # instead of the features' heading and an empty table
            f"Split {split!r} is empty: the conversion put 0 records in it, so it has no statistics. "
            f"Splits with records: {held}.",
        )
    else:
        out.append(_table(feature_rows(info, stats), columns))
    labels = label_rows(info, split)
    if labels:
        title = f"Label {info.label!r} in split {split!r}:" if split else f"Label {info.label!r} per split:"
        out += ["", title, "", _table(labels, list(labels[0]))]
    q = info.quarantine or {}
    out += ["", f"Quarantine: {q.get('records', 0):,} records"]
    if q.get("records"):
        reasons = ", ".join(f"{k} {v:,}" for k, v in (q.get("reasons") or {}).items())
        out[-1] += f" ({reasons}) in {info_path(path, q.get('path', contract.QUARANTINE_DIRNAME + '/'))}"
    return "\n".join(out)


def info_path(path: str, rel: str) -> str:
    return f"{path.rstrip('/')}/{rel}"


def _histogram(s: FeatureStatistics):
    """Equal-width bars from the recorded quantiles: the CDF is linear between distinct
    quantiles, and a value several quantiles share (a point mass: a column 82% zeros)
    counts whole in the bar that holds it."""
    import numpy as np

    q = np.asarray(s.quantiles, float)
    lo, hi = q[0], q[-1]
    if hi <= lo:
        return np.array([lo, lo + 1]), np.array([1.0])
    edges = np.linspace(lo, hi, _BINS + 1)
    ranks = np.linspace(0, 1, len(q))
    # The share of values <= x (right-continuous): from the last quantile at or below x
    # to the next one, linearly.
    above = np.searchsorted(q, edges, side="right")
    i0, i1 = np.clip(above - 1, 0, len(q) - 1), np.clip(above, 0, len(q) - 1)
    span = q[i1] - q[i0]
    t = np.divide(edges - q[i0], span, out=np.zeros_like(edges), where=span > 0)
    cdf = np.where(above >= len(q), 1.0, ranks[i0] + t * (ranks[i1] - ranks[i0]))
    cdf[0] = 0.0  # the first bar holds the values at the minimum too
    return edges, np.diff(cdf)


def panels(info: contract.DatasetInfo, stats) -> tuple:
    """-> (the features plot draws, [(feature, why it is left out)])."""
    shown, left = [], []
    for f in info.features:
        s = stats.get(f.name)
        if s is None:
            left.append((f.name, "no statistics"))
        elif not (s.quantiles or s.top):
            why = "bytes: only its distinct count is recorded" if f.dtype == "bytes" and not f.text else "no values"
            left.append((f.name, why))
        elif len(shown) == _MAX_PANELS:
            left.append((f.name, f"past the first {_MAX_PANELS} panels"))
        else:
            shown.append(f)
    return shown, left


def plot(info: contract.DatasetInfo, out: str, split: str | None = None) -> tuple:
    """Writes histograms (numbers) and top-value bars (text) as one PNG; returns the panel
    count and the features left out, each with why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = info.statistics.of(split)
    shown, left = panels(info, stats)
    cols = min(4, max(1, len(shown)))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax, f in zip(axes.flat, shown):
        s = stats[f.name]
        if s.quantiles and (s.distinct is None or s.distinct > _BARS):
            edges, share = _histogram(s)
            ax.bar(edges[:-1], 100 * share, width=edges[1:] - edges[:-1], align="edge", color="#4878a8")
            ax.set_ylabel("% of values")
        else:
            top = list(s.top[:_BARS])
            if f.name == info.label and all(isinstance(t.value, int) for t in top):
                top.sort(key=lambda t: t.value)  # classes in their order, not by frequency
            top = top[::-1]  # barh draws bottom-up
            total = max(s.values or s.count, 1)
            labels = [_label_text(info, f, t.value) for t in top]
            ax.barh(labels, [100 * t.count / total for t in top], color="#d08838")
            ax.set_xlabel("% of values")
            ax.tick_params(axis="y", labelsize=8)
        missing = percent(s.missing, s.count + s.missing)
        title = f"{f.name} ({_kind(f)})" + (f", {missing} missing" if s.missing else "")
        ax.set_title(title + (" [label]" if f.name == info.label else ""), fontsize=10)
    where = f"split {split!r}" if split else "all splits"
    fig.suptitle(f"{sum(s.records for s in info.splits):,} records, {where}", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # room for the title
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return len(shown), left


def _class_name(info: contract.DatasetInfo, value) -> str | None:
    """An integer label's class name, when the dataset records class names."""
    if info.labels and isinstance(value, int) and 0 <= value < len(info.labels):
        return info.labels[value]
    return None


def _label_text(info: contract.DatasetInfo, f: contract.FeatureSpec, value) -> str:
    name = _class_name(info, value) if f.name == info.label else None
    if name is not None:
        return str(name)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 18 else text[:17] + "…"
