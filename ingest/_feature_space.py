"""A Keras `FeatureSpace` adapted from the statistics recorded at conversion: no pass over the data.

    fs = ingest.feature_space("gs://bucket/ds", features={"age": FeatureSpace.float_normalized(),
                                                          "city": FeatureSpace.string_categorical()})
    ds = ingest.make_dataset(...).map(lambda x: (fs({k: x[k] for k in fs.features}), x["label"]))

Each preprocessing layer gets the state `adapt()` would compute: Normalization the mean
and variance, lookups the vocabulary (most frequent first, ties by the larger value, as
Keras orders it), Discretization bin boundaries from the quantiles.
"""

from __future__ import annotations

import dataclasses
import logging

from ingest import _info, contract
from ingest.names import did_you_mean
from ingest.statistics import FeatureStatistics, ValueCount

__all__ = ["feature_space", "default_features"]

logger = logging.getLogger(__name__)

ONE_HOT_MAX = 100  # text and int features with at most this many values become one-hot lookups


def _keras():
    import keras

    return keras


def default_features(info: contract.DatasetInfo, stats, *, hashing_dim: int = 32, ids: frozenset = frozenset()) -> dict:
    """Specs from the schema and statistics: numbers normalized, few-valued text and
    ints one-hot, other text hashed into `hashing_dim` bins. The label, list and binary
    features are left out (FeatureSpace takes scalars)."""
    fs = _keras().utils.FeatureSpace
    specs = {}
    for f in info.features:
        s = stats.get(f.name)
        if f.name == info.label or not f.is_scalar or s is None or (f.dtype == "bytes" and not f.text):
            continue
        vocabulary = s.vocabulary
        few = vocabulary is not None and len(vocabulary) <= ONE_HOT_MAX
        if f.name in ids and not few:  # text read as its vocabulary's ids (text="ids"): hashed, as its strings
            specs[f.name] = fs.integer_hashed(hashing_dim)
            continue
        if f.dtype != "bytes" and not few and s.mean is None:
            logger.warning("feature %r is left out of the FeatureSpace: it has no finite values to normalize", f.name)
            continue
        if f.dtype == "bytes":
            specs[f.name] = fs.string_categorical() if few else fs.string_hashed(hashing_dim)
        elif f.dtype == "int64" and few:
            specs[f.name] = fs.integer_categorical()
        else:
            specs[f.name] = fs.float_normalized()
    if not specs:
        raise ValueError("this dataset has no scalar feature besides the label to build a FeatureSpace from")
    return specs


def feature_space(
    path: str,
    *,
    features=None,
    output_mode: str = "concat",
    split: str | None = "train",
    text: str = "strings",
    summary: bool = False,
    **kwargs,
):
    """Returns a `keras.utils.FeatureSpace` adapted from the dataset's statistics.

    Args:
      path: a converted dataset (local or gs://), converted with statistics (the default);
        or a list or glob of them (spans), whose statistics are merged.
      features: {name: spec} as `keras.utils.FeatureSpace` takes them
        (`FeatureSpace.float_normalized()`, `"string_categorical"`, ...); None picks
        specs from the schema and statistics (`default_features`).
      output_mode: "concat" or "dict", as FeatureSpace.
      split: whose statistics to use (the training split, so evaluation data does not
        leak into preprocessing); None for all splits together.
      text: how the dataset it preprocesses yields text features, as `make_dataset`'s
        `text`: "strings", or "ids" (then each text feature is an int64 feature of its
        vocabulary's ids: few-valued ones one-hot by `integer_categorical`, the others
        hashed by `integer_hashed`).
      summary: print a table of what each feature became (`summary_table`): its spec,
        the dimensions it adds to the output, and why a default was picked.
      **kwargs: passed to FeatureSpace (crosses, crossing_dim, hashing_dim, ...).
    """
    info = _info.load_info(path)
    if info.statistics is None:
        raise ValueError(
            f"{path} has no statistics: it was converted with --no_statistics or by an older ingest. "
            "Reconvert it without --no_statistics, or call FeatureSpace.adapt on a dataset"
        )
    if split is not None and split not in info.statistics.splits:
        raise ValueError(f"{path} has no statistics for split {split!r}; splits: {sorted(info.statistics.splits)}")
    stats = info.statistics.of(split)
    if text not in ("strings", "ids"):
        raise ValueError(f"text must be 'strings' or 'ids', as make_dataset takes it, got {text!r}")
    ids = frozenset()
    if text == "ids":
        info, stats, ids = _as_ids(info, stats)
    keras = _keras()
    picked = features is None
    if features is None:
        features = default_features(info, stats, hashing_dim=kwargs.get("hashing_dim", 32), ids=ids)
    _check_names(path, features, info, stats)
    space = keras.utils.FeatureSpace(features=features, output_mode=output_mode, **kwargs)
    for name in space._list_adaptable_preprocessors():
        if name not in stats:
            raise ValueError(f"feature {name!r} has no statistics in {path}; features: {sorted(stats)}")
        _check_kind(name, space.preprocessors[name], info.feature(name))
        _adapt(name, space.preprocessors[name], _with_fill(stats[name], info.feature(name), as_ids=name in ids))
    # What FeatureSpace.adapt does once its layers are adapted.
    space._is_adapted = True
    space.get_encoded_features()
    space.built = True
    space._sublayers_built = True
    if summary:
        print(summary_table(space, info, stats, picked=picked))
    return space


def _as_ids(info: contract.DatasetInfo, stats: dict) -> tuple:
    """The schema and statistics of the text features as make_dataset(text="ids") yields them:
    int64 ids of their vocabulary (a recorded value v has id vocabulary.index(v) + 1), and
    the names of those features."""
    features, out, ids = [], dict(stats), set()
    for f in info.features:
        if f.dtype != "bytes" or not f.text or f.name not in info.vocabularies or f.name == info.label:
            features.append(f)
            continue
        id_of = {v: i + 1 for i, v in enumerate(info.vocabulary(f.name))}
        default = id_of.get(f.default, 0)
        features.append(dataclasses.replace(f, dtype="int64", text=False, default=default))
        ids.add(f.name)
        s = stats.get(f.name)
        if s is not None:
            top = tuple(ValueCount(id_of.get(t.value, 0), t.count) for t in s.top)
            out[f.name] = dataclasses.replace(s, top=top)
    return dataclasses.replace(info, features=tuple(features), vocabularies={}), out, frozenset(ids)


# A spec's name as FeatureSpace takes it in `features=` (SPEC_NAMES), by its preprocessing layer.
_SPEC_OF_LAYER = {
    "Normalization": "float_normalized",
    "Discretization": "float_discretized",
    "Rescaling": "float_rescaled",
    "StringLookup": "string_categorical",
    "IntegerLookup": "integer_categorical",
}


def _spec_name(feature) -> str:
    layer = type(feature.preprocessor).__name__
    if layer == "Hashing":
        return "string_hashed" if feature.dtype == "string" else "integer_hashed"
    return _SPEC_OF_LAYER.get(layer, "float" if layer == "Identity" else layer)


def _values(s: FeatureStatistics | None) -> str:
    if s is None or s.distinct is None:
        return "not counted"  # floats, and ints past the exact count
    return f"{s.distinct:,}" if s.distinct_exact else f"~{s.distinct:,}"


def _why(spec: str, s: FeatureStatistics | None, dims: int) -> str:
    """Why `default_features` picked `spec`, in its own terms."""
    if spec in ("string_categorical", "integer_categorical"):
        return f"at most {ONE_HOT_MAX} values: one-hot"
    if spec.endswith("_hashed"):
        return f"more than {ONE_HOT_MAX} values: hashed into {dims} bins"
    if s is not None and s.distinct is not None:
        return f"more than {ONE_HOT_MAX} values: a number"
    return "a number"


def summary_table(space, info: contract.DatasetInfo, stats, *, picked: bool = True) -> str:
    """One row per feature of an adapted `space`: its distinct values, the spec it got (as
    `features=` takes it by name), the output dimensions it adds and, where
    `default_features` picked it (`picked`), why; the total last. A few-valued int column
    one-hot encoded adds its number of values plus one: the table shows where the width of
    the output comes from, and `features=` with another spec changes it. Values are
    counted as make_dataset delivers them, a missing one as the feature's default."""
    from ingest._describe import _table

    rows, total = [], 0
    for name, feature in space.features.items():
        encoder = space.one_hot_encoders.get(name)
        dims = int(encoder.num_tokens) if encoder is not None else 1
        total += dims
        spec = _spec_name(feature)
        s = stats.get(name)
        s = None if s is None else _with_fill(s, info.feature(name))
        why = _why(spec, s, dims) if picked else "given"
        rows.append({"feature": name, "values": _values(s), "spec": spec, "dims": f"{dims:,}", "why": why})
    rows.append({"feature": f"total ({len(rows)} features)", "dims": f"{total:,}"})
    return _table(rows, ["feature", "values", "spec", "dims", "why"])


# The spec names keras.utils.FeatureSpace takes as strings (FeatureSpace._standardize_feature).
SPEC_NAMES = (
    "float",
    "float_normalized",
    "float_rescaled",
    "float_discretized",
    "integer_categorical",
    "integer_hashed",
    "string_categorical",
    "string_hashed",
)


def _check_names(path, features, info: contract.DatasetInfo, stats) -> None:
    """Refuses a misspelt feature or spec name with the nearest one: Keras says only
    'Invalid feature type', and a missing feature fails later with no hint."""
    names = [f.name for f in info.features]
    for name, spec in dict(features).items():
        if name not in names:
            raise ValueError(
                f"feature {name!r}{did_you_mean(name, names)} is not a feature of {path}; features: {names}"
            )
        if isinstance(spec, str) and spec not in SPEC_NAMES:
            raise ValueError(
                f"feature {name!r}: {spec!r}{did_you_mean(spec, SPEC_NAMES)} is not a FeatureSpace type; "
                f"the types: {', '.join(SPEC_NAMES)}"
            )


def _check_kind(name: str, layer, spec: contract.FeatureSpec) -> None:
    """Refuses a spec whose preprocessing does not take the feature's values."""
    layers = _keras().layers
    kind = "text" if spec.text else spec.dtype
    takes = {
        layers.Normalization: ("int64", "float32", "float64"),
        layers.Discretization: ("int64", "float32", "float64"),
        layers.IntegerLookup: ("int64",),
        layers.StringLookup: ("text",),
    }
    for layer_type, kinds in takes.items():
        if isinstance(layer, layer_type) and kind not in kinds:
            raise ValueError(
                f"feature {name!r} holds {kind} values, but its FeatureSpace spec preprocesses with "
                f"{layer_type.__name__}, which takes {' or '.join(kinds)}: give it a spec for {kind} "
                f"({_SPEC_FOR.get(kind, 'none fits')})"
            )


_SPEC_FOR = {
    "text": "string_categorical or string_hashed",
    "int64": "integer_categorical, float_normalized or float_discretized",
    "float32": "float_normalized or float_discretized",
    "float64": "float_normalized or float_discretized",
}


def _with_fill(s: FeatureStatistics, spec: contract.FeatureSpec, *, as_ids: bool = False) -> FeatureStatistics:
    """The statistics of the values as make_dataset delivers them: a record without a
    value holds the feature's default, which `adapt()` on the dataset would count too.

    Ties are ordered as `adapt()` orders them, the larger value first; `as_ids` (text read
    as vocabulary ids): as their strings are, which is the smaller id first (the vocabulary
    ranks ties the larger string first), so that ids encode each row as strings do."""
    if not s.missing or not spec.is_scalar:
        return s
    fill = spec.default
    changes = {}
    if s.mean is not None:
        n, m = s.count - (s.nan or 0) - (s.inf or 0), s.missing
        mean = (s.mean * n + fill * m) / (n + m)
        m2 = s.std**2 * n + (fill - s.mean) ** 2 * n * m / (n + m)  # Chan's update with m copies of `fill`
        changes.update(mean=mean, std=(m2 / (n + m)) ** 0.5)
    if s.vocabulary is not None:
        if isinstance(fill, bytes):
            fill = fill.decode("utf-8")
        counts = {t.value: t.count for t in s.top}
        counts[fill] = counts.get(fill, 0) + s.missing
        order = (lambda v: -v) if as_ids else _order_key
        top = sorted(counts.items(), key=lambda vc: (vc[1], order(vc[0])), reverse=True)
        changes.update(top=tuple(ValueCount(v, c) for v, c in top), distinct=len(top))
    return dataclasses.replace(s, **changes)


def _order_key(value):
    return value.encode("utf-8") if isinstance(value, str) else value


def _adapt(name: str, layer, s: FeatureStatistics) -> None:
    layers = _keras().layers
    if isinstance(layer, layers.Normalization):
        if s.mean is None:
            raise ValueError(f"feature {name!r} has no mean and variance (not a number, or no finite values)")
        layer.build((None, 1))
        layer.adapt_mean.assign([s.mean])
        layer.adapt_variance.assign([s.variance])
        layer.finalize_state()
    elif isinstance(layer, (layers.StringLookup, layers.IntegerLookup)):
        layer.set_vocabulary(_vocabulary(name, layer, s))
    elif isinstance(layer, layers.Discretization):
        if not s.quantiles:
            raise ValueError(f"feature {name!r} has no quantiles (not a number, or no finite values)")
        bins = layer.num_bins
        layer.bin_boundaries = [s.quantile(i / bins) for i in range(1, bins)]
    else:
        raise ValueError(
            f"feature {name!r}: a {type(layer).__name__} cannot be adapted from statistics; "
            "adapt that feature's layer on the data"
        )


def _vocabulary(name: str, layer, s: FeatureStatistics) -> list:
    if not s.top:
        raise ValueError(f"feature {name!r} has no recorded values to build a vocabulary from")
    vocabulary = s.vocabulary
    if vocabulary is None:
        logger.warning(
            "feature %r: its %s distinct values are not all recorded; the vocabulary is its %d most frequent values%s",
            name,
            s.distinct,
            len(s.top),
            "" if s.top_exact else " (approximate counts)",
        )
        vocabulary = [t.value for t in s.top]
    special = {layer.mask_token, layer.oov_token} - {None}
    vocabulary = [v for v in vocabulary if v not in special]  # adapt() drops them too
    if layer.max_tokens:
        vocabulary = vocabulary[: layer.max_tokens - layer._token_start_index()]
    return vocabulary
