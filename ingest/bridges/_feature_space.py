"""A Keras `FeatureSpace` adapted from the statistics recorded at conversion: no pass over the data.

    fs = ingest.feature_space("gs://bucket/ds")                   # every feature, defaults picked
    fs = ingest.feature_space("gs://bucket/ds", features=["age", "city"])
    fs = ingest.feature_space("gs://bucket/ds", features={"age": FeatureSpace.float_normalized()})
    ds = ingest.make_dataset(...).map(lambda x, y: (fs(x), y))

Each preprocessing layer gets the state `adapt()` would compute: Normalization the mean
and variance, lookups the vocabulary (most frequent first, ties by the larger value, as
Keras orders it; past one-hot, the vocabulary the conversion recorded, so that a value's id
is the one `make_dataset(text="ids")` gives it), Discretization bin boundaries from the
quantiles. A feature some records lacked is imputed from the statistics of the values
present and gets a missing indicator (`missing="mask"`, `ingest.bridges._space_layer`).
"""

from __future__ import annotations

import dataclasses
import logging

from ingest import contract
from ingest.metadata import _info
from ingest.names import did_you_mean
from ingest.statistics import ONE_HOT_MAX, FeatureStatistics, ValueCount

__all__ = ["feature_space", "default_features"]

logger = logging.getLogger(__name__)

# An int feature of more values than ONE_HOT_MAX is an identifier (a user, a flight, a row),
# not a measurement, when its distinct values are at least this share of its values: each
# value then repeats less than twice on average, while a measurement rounded to what it was
# recorded at repeats more the more rows there are (the test corpus' `count`, 1,000 values
# over 16,000 rows: 0.06). Identifiers are looked up or hashed into ids, not normalized.
ID_SHARE = 0.5
# The conversion counts an int feature's values exactly up to this many distinct ones
# (beam_jobs/stats/features.py EXACT_VALUES); past it, it records no `distinct`.
EXACT_INT_VALUES = 10_000
# Text without a recorded vocabulary (more distinct values than the conversion's limit) is
# hashed into the smallest power of two at least its distinct count, so that no fewer bins
# than values; at most this many (2**20 ids of a 64-wide float32 embedding take 256 MB).
HASH_BINS_MAX = 1 << 20


def _keras():
    import keras

    return keras


def default_features(
    info: contract.DatasetInfo,
    stats,
    *,
    hashing_dim: int = 32,
    ids: frozenset = frozenset(),
    names=None,
    vocabulary_sizes=None,
) -> dict:
    """Specs from the schema and statistics (`_pick` says which and why); the label, list and
    binary features are left out unless named in `names` (FeatureSpace takes scalars)."""
    return {name: spec for name, (spec, _) in _picked(info, stats, hashing_dim, ids, names, vocabulary_sizes).items()}


def _picked(info, stats, hashing_dim: int, ids: frozenset, names, vocabulary_sizes) -> dict:
    """{name: (spec, why)} for the features `names` (None: every scalar one but the label)."""
    vocabulary_sizes = vocabulary_sizes or {}
    out = {}
    for f in info.features:
        if (f.name == info.label) if names is None else (f.name not in names):
            continue
        s = stats.get(f.name)
        spec, why = _pick(f, s, vocabulary_sizes.get(f.name), f.name in ids, hashing_dim)
        if spec is not None:
            out[f.name] = (spec, why)
        elif names is not None:
            raise ValueError(f"feature {f.name!r} cannot be in a FeatureSpace: {why}; leave it out of features=")
        elif s is not None and f.is_scalar and f.dtype != "bytes":
            logger.warning("feature %r is left out of the FeatureSpace: %s", f.name, why)
    if not out:
        raise ValueError("this dataset has no scalar feature besides the label to build a FeatureSpace from")
    return out


def _pick(f: contract.FeatureSpec, s: FeatureStatistics | None, vocabulary_size, as_ids: bool, hashing_dim: int):
    """(spec, why): the default of one feature, or (None, why it has none)."""
    fs = _keras().utils.FeatureSpace
    text = f.text or as_ids
    if not f.is_scalar:
        return None, "a list (FeatureSpace takes scalars)"
    if f.dtype == "bytes" and not f.text:
        return None, "binary values, not text"
    if s is None:
        return None, "no statistics recorded"
    vocabulary = s.vocabulary
    if vocabulary is not None and len(vocabulary) <= ONE_HOT_MAX:
        spec = fs.string_categorical() if f.dtype == "bytes" else fs.integer_categorical()
        return spec, f"{len(vocabulary)} values (at most {ONE_HOT_MAX}): one-hot"
    if text and vocabulary_size is not None:
        spec = (fs.integer_categorical if as_ids else fs.string_categorical)(output_mode="int")
        return spec, f"{vocabulary_size:,} values recorded (more than {ONE_HOT_MAX}): ids for an embedding"
    if text:
        bins = _hash_bins(s.distinct, hashing_dim)
        mode = "int" if bins > ONE_HOT_MAX else "one_hot"
        why = f"~{s.distinct or 0:,} values, no vocabulary recorded: hashed into {bins:,} bins"
        return fs.string_hashed(bins, output_mode=mode), why + (", ids for an embedding" if mode == "int" else "")
    if f.dtype == "int64" and _identifier_like(s):
        share = f"{s.distinct:,} values" if s.distinct is not None else f"over {EXACT_INT_VALUES:,} values"
        why = f"{share} in {s.count:,} rows, at least {ID_SHARE:.0%} distinct: an identifier, "
        if vocabulary is not None:
            return fs.integer_categorical(output_mode="int"), why + "looked up into ids for an embedding"
        bins = _hash_bins(s.distinct or EXACT_INT_VALUES + 1, hashing_dim)
        return fs.integer_hashed(bins, output_mode="int"), why + f"hashed into {bins:,} ids for an embedding"
    if s.mean is None:
        return None, "it has no finite values to normalize"
    if s.distinct is not None:
        return fs.float_normalized(), f"{s.distinct:,} values (more than {ONE_HOT_MAX}, not an identifier): a number"
    if f.dtype == "int64":
        why = f"over {EXACT_INT_VALUES:,} values, not counted: a number (an id? give it integer_hashed)"
        return fs.float_normalized(), why
    return fs.float_normalized(), "a number"


def _identifier_like(s: FeatureStatistics) -> bool:
    """At least ID_SHARE of the values distinct; past the exact count, the least it can be."""
    distinct = s.distinct if s.distinct is not None else EXACT_INT_VALUES + 1
    return s.count > 0 and distinct > ONE_HOT_MAX and distinct >= ID_SHARE * s.count


def _hash_bins(distinct: int | None, hashing_dim: int) -> int:
    """The smallest power of two at least `distinct` (and `hashing_dim`), at most HASH_BINS_MAX."""
    bins = 1 << max(0, int(distinct or 0) - 1).bit_length()
    return max(hashing_dim, min(bins, HASH_BINS_MAX))


def feature_space(
    path: str,
    *,
    features=None,
    output_mode: str = "concat",
    split: str | None = "train",
    text: str = "strings",
    missing: str = "mask",
    summary: bool = False,
    **kwargs,
):
    """Returns a `keras.utils.FeatureSpace` adapted from the dataset's statistics.

    Call it on a batch's features dict whole (`space(x)`): it takes the features it
    preprocesses and, with `missing="mask"`, their masks `f_missing`.

    Args:
      path: a converted dataset (local or gs://), converted with statistics (the default);
        or a list or glob of them (spans), whose statistics are merged.
      features: a list of names, as `make_dataset` takes it, whose specs are picked from
        the schema and statistics; or {name: spec} as `keras.utils.FeatureSpace` takes
        them (`FeatureSpace.float_normalized()`, `"string_categorical"`, ...); None picks
        specs for every scalar feature but the label. The picks: a text or int feature of
        at most 100 values (ONE_HOT_MAX) is one-hot; text of more values with a recorded
        vocabulary is looked up in it into ids for an embedding (`output_mode="int"`, the
        ids `make_dataset(text="ids")` gives); text without one is hashed into the
        smallest power of two bins at least its distinct count (ids past 100 bins); an int
        feature whose distinct values are at least half its values (ID_SHARE) is an
        identifier, looked up or hashed into ids; other numbers are normalized.
      output_mode: "concat" or "dict", as FeatureSpace. With "concat", features given as
        ids (for embeddings) cannot be concatenated: the output is then a dict of the
        concatenation under "concat" and each such feature's ids under its name.
      split: whose statistics to use (the training split, so evaluation data does not
        leak into preprocessing); None for all splits together.
      text: how the dataset it preprocesses yields text features, as `make_dataset`'s
        `text`: "strings", or "ids" (then each text feature is an int64 feature of its
        vocabulary's ids, id 0 out of vocabulary, encoded as its strings would be).
      missing: as `make_dataset`'s `missing`. "mask": each feature some records lacked
        (its schema's `missing` count above 0) takes its mask `f_missing` from the
        batch, is imputed where the mask is True (the mean of the values present for a
        number, the median for a discretized one, the most frequent value for a
        categorical or hashed one) and adds the indicator `f_missing` (0/1) to the
        output, as scikit-learn's `SimpleImputer(add_indicator=True)`. "fill": no masks;
        a missing value is the feature's default (0, 0.0, "") and counted as one, as
        `adapt()` on the dataset would count it.
      summary: print a table of what each feature became (`summary_table`): its spec,
        the dimensions it adds to the output, why a default was picked, and what a
        missing value becomes.
      **kwargs: passed to FeatureSpace (crosses, crossing_dim, hashing_dim, ...).
    """
    info, stats = _statistics(path, split)
    if text not in ("strings", "ids"):
        raise ValueError(f"text must be 'strings' or 'ids', as make_dataset takes it, got {text!r}")
    if missing not in contract.MISSING_MODES:
        raise ValueError(f"missing must be 'mask' or 'fill', as make_dataset takes it, got {missing!r}")
    sizes = {n: int(v["size"]) for n, v in info.vocabularies.items() if n != info.label}
    recorded = _recorded(info, sizes, as_ids=text == "ids")
    ids = frozenset()
    if text == "ids":
        info, stats, ids = _as_ids(info, stats)
    whys = {}
    if features is None or not isinstance(features, dict):
        names = None if features is None else _listed(path, features, info)
        picks = _picked(info, stats, kwargs.get("hashing_dim", 32), ids, names, sizes)
        features, whys = {n: p[0] for n, p in picks.items()}, {n: p[1] for n, p in picks.items()}
    _check_names(path, features, info, stats)
    filled = missing == "fill"
    imputed = {} if filled else _imputed(features, info, stats)
    space = _build(path, features, output_mode, imputed, kwargs, info, stats, recorded, ids, filled)
    if summary:
        print(summary_table(space, info, stats, whys=whys, filled=filled))
    return space


def _statistics(path, split):
    info = _info.load_info(path)
    if info.statistics is None:
        raise ValueError(
            f"{path} has no statistics: it was converted with --no_statistics or by an older ingest. "
            "Reconvert it without --no_statistics, or call FeatureSpace.adapt on a dataset"
        )
    if split is not None and split not in info.statistics.splits:
        raise ValueError(f"{path} has no statistics for split {split!r}; splits: {sorted(info.statistics.splits)}")
    return info, info.statistics.of(split)


def _listed(path, features, info: contract.DatasetInfo) -> list:
    """`features=` as a list of names, each a feature of the dataset."""
    names = [f.name for f in info.features]
    listed = [features] if isinstance(features, str) else list(features)
    for name in listed:
        if name not in names:
            raise ValueError(
                f"feature {name!r}{did_you_mean(name, names)} is not a feature of {path}; features: {names}"
            )
    return listed


def _recorded(info: contract.DatasetInfo, sizes: dict, *, as_ids: bool) -> dict:
    """{name: () -> vocabulary} of the text features with a recorded vocabulary: its values,
    or read as ids (`as_ids`) the ids 1..n they arrive as. Read only when a layer needs it."""
    if as_ids:
        return {n: (lambda k=k: list(range(1, k + 1))) for n, k in sizes.items()}
    return {n: (lambda n=n: list(info.vocabulary(n))) for n in sizes}


def _imputed(features: dict, info: contract.DatasetInfo, stats) -> dict:
    """{name: value} for the features whose records may lack them (the schema's `missing`):
    what the preprocessing sees in their place (None: nothing recorded to impute)."""
    out = {}
    for name, spec in features.items():
        s = stats.get(name)
        if info.feature(name).missing <= 0:
            continue
        kind = _impute_kind(spec)
        if s is None or s.count == 0:
            out[name] = None
        elif kind == "median":
            out[name] = float(s.quantile(0.5)) if s.quantiles else None
        elif kind == "mean":
            out[name] = None if s.mean is None else float(s.mean)
        else:
            out[name] = s.top[0].value if s.top else None
    return out


def _impute_kind(spec) -> str:
    """ "mean", "median" or "mode" (most frequent), by the spec's preprocessing layer."""
    if isinstance(spec, dict):
        spec = _keras().saving.deserialize_keras_object(spec)
    layer = spec if isinstance(spec, str) else type(spec.preprocessor).__name__
    if layer in ("float_discretized", "Discretization"):
        return "median"
    if layer in ("float", "float_normalized", "float_rescaled", "Normalization", "Rescaling", "Identity"):
        return "mean"
    return "mode"


def _build(path, features, output_mode, imputed, kwargs, info, stats, recorded, ids, filled):
    """The space with each adaptable layer given the statistics' state, marked adapted."""
    from ingest.bridges._space_layer import ImputingFeatureSpace

    space = ImputingFeatureSpace(features=features, output_mode=output_mode, missing=imputed, **kwargs)
    for name in space._list_adaptable_preprocessors():
        if name not in stats:
            raise ValueError(f"feature {name!r} has no statistics in {path}; features: {sorted(stats)}")
        _check_kind(name, space.preprocessors[name], info.feature(name))
        s = _with_fill(stats[name], info.feature(name), as_ids=name in ids) if filled else stats[name]
        as_ids = space.features[name].output_mode == "int"
        _adapt(name, space.preprocessors[name], s, recorded.get(name), as_ids=as_ids)
    # What FeatureSpace.adapt does once its layers are adapted.
    space._is_adapted = True
    space.get_encoded_features()
    space.built = True
    space._sublayers_built = True
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


def _spec_name(feature, hashing_dim: int = 32) -> str:
    """The spec as `features=` takes it: by name, or as the FeatureSpace call that makes it."""
    layer = feature.preprocessor
    kind = type(layer).__name__
    if kind == "Hashing":
        name = "string_hashed" if feature.dtype == "string" else "integer_hashed"
        args = [str(layer.num_bins)] if layer.num_bins != hashing_dim or feature.output_mode == "int" else []
    else:
        name, args = _SPEC_OF_LAYER.get(kind, "float" if kind == "Identity" else kind), []
    if feature.output_mode == "int":
        args.append('output_mode="int"')
    return f"{name}({', '.join(args)})" if args else name


def _values(s: FeatureStatistics | None) -> str:
    if s is None or s.distinct is None:
        return "not counted"  # floats, and ints past the exact count
    return f"{s.distinct:,}" if s.distinct_exact else f"~{s.distinct:,}"


_IMPUTED_WITH = {"mean": "the mean", "median": "the median", "mode": "the most frequent value"}


def summary_table(space, info: contract.DatasetInfo, stats, *, whys=None, filled: bool = False) -> str:
    """One row per feature of an adapted `space`: its distinct values, the spec it got (as
    `features=` takes it), the output dimensions it adds ("id": an id for an embedding,
    apart from the concatenation) and why `default_features` picked it (`whys`; "given"
    where `features=` gave the spec); with missing="mask", a row per missing indicator
    after its feature, saying what the missing values become; the total last. A
    few-valued int column one-hot encoded adds its number of values plus one: the table
    shows where the width of the output comes from, and `features=` with another spec
    changes it. `filled`: values counted as make_dataset(missing="fill") delivers them,
    a missing one as the feature's default."""
    from ingest.inspection._describe import _table

    rows, total, whys = [], 0, whys or {}
    for name, feature in space.features.items():
        encoder = space.one_hot_encoders.get(name)
        dims = int(encoder.num_tokens) if encoder is not None else 1
        ids = feature.output_mode == "int"
        total += 0 if ids else dims
        s = stats.get(name)
        s = None if s is None else _with_fill(s, info.feature(name)) if filled else s
        spec = _spec_name(feature, space.hashing_dim)
        row = {"feature": name, "values": _values(s), "spec": spec, "dims": "id" if ids else f"{dims:,}"}
        rows.append({**row, "why": whys.get(name, "given")})
        if name in space.missing:
            total += 1
            rows.append(_indicator_row(name, feature, s, space.missing[name]))
    rows.append({"feature": f"total ({len(space.features)} features)", "dims": f"{total:,}"})
    return _table(rows, ["feature", "values", "spec", "dims", "why"])


def _indicator_row(name: str, feature, s: FeatureStatistics | None, value) -> dict:
    lacked = f"{s.missing:,} missing" if s is not None else ""
    if value is None:
        what = "nothing recorded to impute: the fill stays"
    else:
        shown = f"{value:.6g}" if isinstance(value, float) else repr(value)
        what = f"imputed with {_IMPUTED_WITH[_impute_kind(feature)]} ({shown}), 1 where missing"
    return {"feature": name + contract.MASK_SUFFIX, "values": lacked, "spec": "indicator", "dims": "1", "why": what}


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


def _adapt(name: str, layer, s: FeatureStatistics, recorded=None, *, as_ids: bool = False) -> None:
    """Gives `layer` the state adapt() would; `recorded`: () -> the feature's recorded
    vocabulary; `as_ids`: its spec outputs ids (for an embedding), not one-hot."""
    layers = _keras().layers
    if isinstance(layer, layers.Normalization):
        if s.mean is None:
            raise ValueError(f"feature {name!r} has no mean and variance (not a number, or no finite values)")
        layer.build((None, 1))
        layer.adapt_mean.assign([s.mean])
        layer.adapt_variance.assign([s.variance])
        layer.finalize_state()
    elif isinstance(layer, (layers.StringLookup, layers.IntegerLookup)):
        layer.set_vocabulary(_vocabulary(name, layer, s, recorded, as_ids))
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


def _vocabulary(name: str, layer, s: FeatureStatistics, recorded, as_ids: bool) -> list:
    """The split's vocabulary for one-hot; for ids (output_mode "int"), or where the split's
    statistics do not hold every value, the vocabulary the conversion recorded, so that ids
    are those make_dataset(text="ids") gives; else the most frequent values, with a warning."""
    vocabulary = s.vocabulary
    if recorded is not None and (vocabulary is None or as_ids):
        vocabulary = recorded()
    elif not s.top:
        raise ValueError(f"feature {name!r} has no recorded values to build a vocabulary from")
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
