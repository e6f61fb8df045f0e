"""Preprocessing from the recorded statistics without Keras: for PyTorch, JAX and numpy models.

    pre = ingest.preprocessing("out/ds")            # metadata only: no TensorFlow, no pass
    x = pre.matrix(features)                        # numbers standardized, stacked [batch, n]
    nn.Embedding(pre.vocabulary_sizes["city"], 16)  # text as ids (loader(text="ids"))

The numbers are `feature_space`'s: each number's mean and standard deviation, a text
feature's vocabulary as the conversion recorded it (id 0 out of vocabulary), the label's
classes. With missing="mask" (the default, as make_dataset's) a feature some records
lacked is imputed where its mask `f_missing` is True (a number with the mean of the
values present, text ids with the most frequent value's id) and gets the indicator
`f_missing` (0/1), as scikit-learn's `SimpleImputer(add_indicator=True)`; with
missing="fill" a missing value is the feature's default, counted as `adapt()` would.
"""

from __future__ import annotations

import dataclasses

from ingest import contract
from ingest.metadata import _info

__all__ = ["Preprocessing", "preprocessing"]

MISSING_SUFFIX = contract.MASK_SUFFIX  # make_dataset's mask of feature f is f + MISSING_SUFFIX


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """What a model's input layer needs, from the statistics; call it on a batch's features.

    Attributes:
        numbers: {feature: (mean, std)} for the number features standardized.
        vocabulary_sizes: {feature: ids} for text read as ids (`text="ids"`): an
            embedding's rows (the vocabulary and id 0, out of vocabulary).
        classes: the label's classes (its ids index them), or ().
        missing: {feature: rows} of the features some rows lacked in the statistics'
            split; those rows hold the feature's default (0, "") in the batches.
        left_out: {feature: why} for the features neither standardized nor counted as ids.
        imputed: {feature: value} (missing="mask"): the features whose mask `f_missing`
            the batch holds, and what their missing rows become (a number's mean, a text
            feature's most frequent id); None where nothing was recorded to impute.
    """

    numbers: dict
    vocabulary_sizes: dict
    classes: tuple
    missing: dict
    left_out: dict
    imputed: dict = dataclasses.field(default_factory=dict)

    def __call__(self, features: dict) -> dict:
        """Each feature in `imputed` imputed where its mask is True, with its indicator
        `f_missing` as 0.0/1.0; each number feature standardized ((x - mean) / std, std 0
        taken as 1); the others as they are.

        Works on numpy arrays, torch tensors and JAX arrays alike (plain arithmetic)."""
        out = dict(features)
        lacked = {name: self._mask(out, name) for name in self.imputed if name in out}
        for name, (mean, std) in self.numbers.items():
            if name in out:
                out[name] = (out[name] * 1.0 - mean) / (std or 1.0)
                if name in lacked and self.imputed[name] is not None:
                    # The mean standardized is 0: exactly 0 there, as feature_space gives; a
                    # present value kept as it is (times True), an infinity too.
                    out[name] = out[name] * ~lacked[name]
        for name, mask in lacked.items():
            value = self.imputed[name]
            if name not in self.numbers and value is not None:  # ids: x where present, value where not
                out[name] = out[name] + (value - out[name]) * (mask * 1)
            out[name + MISSING_SUFFIX] = mask * 1.0
        return out

    @staticmethod
    def _mask(features: dict, name: str):
        if name + MISSING_SUFFIX not in features:
            raise ValueError(
                f"feature {name!r}: the batch has no {name + MISSING_SUFFIX!r}, the mask of the records that "
                "lacked it, which make_dataset(missing='mask') yields; pass the batch whole, or build the "
                "preprocessing with missing='fill'"
            )
        return features[name + MISSING_SUFFIX]

    def matrix(self, features: dict):
        """The standardized numbers as one [batch, n] float matrix, in `numbers`' order, then
        the missing indicators of those numbers that have one, in the same order."""
        done = self(features)
        names = list(self.numbers) + [n + MISSING_SUFFIX for n in self.numbers if n in self.imputed]
        columns = [done[name] for name in names]
        first = columns[0]
        if type(first).__module__.startswith("torch"):
            import torch

            return torch.stack([c.float() for c in columns], dim=1)
        if type(first).__module__.startswith("jax"):
            import jax.numpy as jnp

            return jnp.stack(columns, axis=1).astype(jnp.float32)
        import numpy as np

        return np.stack(columns, axis=1).astype(np.float32)

    @property
    def summary(self) -> str:
        """A table: each feature, what it becomes, and the numbers it uses."""
        from ingest.inspection._describe import _table

        rows = [
            {"feature": n, "becomes": "standardized", "numbers": f"mean {m:.6g}, std {s:.6g}"}
            for n, (m, s) in self.numbers.items()
        ]
        rows += [
            {"feature": n, "becomes": "ids", "numbers": f"{k:,} ids (0: out of vocabulary)"}
            for n, k in self.vocabulary_sizes.items()
        ]
        rows += [{"feature": n, "becomes": "left out", "numbers": why} for n, why in self.left_out.items()]
        for row in rows:
            name = row["feature"]
            if name in self.imputed and row["becomes"] != "left out":
                value = self.imputed[name]
                shown = "nothing recorded to impute" if value is None else f"imputed with {value:.6g}"
                row["numbers"] += f"; {self.missing.get(name, 0):,} rows missing: {shown}, indicator {name}_missing"
            elif name in self.missing:
                row["numbers"] += f"; {self.missing[name]:,} rows missing (the default in their place)"
        return _table(rows, ["feature", "becomes", "numbers"])


def preprocessing(path, *, split: str | None = "train", features=None, missing: str = "mask") -> Preprocessing:
    """Preprocessing from the statistics `path`'s conversion recorded: numbers standardized,
    text features' vocabulary sizes (for embeddings of `text="ids"`), the label's classes.

    Args:
        path: a converted dataset, or several (spans), as `load_info` takes it.
        split: whose statistics (the training split: evaluation data must not leak into
            preprocessing); None for all splits together.
        features: the names to cover (as `make_dataset`'s `features=`); None: every scalar
            feature but the label.
        missing: as make_dataset's `missing`. "mask": each feature whose schema counts
            missing records is imputed where its mask `f_missing` is True and gets that
            indicator (0/1); the numbers are those of the values present. "fill": no
            masks; the default in a missing record's place, counted into the numbers.
    """
    from ingest.bridges._feature_space import _with_fill

    if missing not in contract.MISSING_MODES:
        raise ValueError(f"missing must be 'mask' or 'fill', as make_dataset takes it, got {missing!r}")
    info = _info.load_info(path)
    if info.statistics is None:
        raise ValueError(f"{path} has no statistics: reconvert it without --no_statistics")
    if split is not None and split not in info.statistics.splits:
        raise ValueError(f"{path} has no statistics for split {split!r}; splits: {sorted(info.statistics.splits)}")
    stats = info.statistics.of(split)
    names = [f.name for f in info.features]
    wanted = names if features is None else list(features)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ValueError(f"features {unknown} do not exist in {path}; features: {names}")
    numbers, sizes, lacked, left, imputed = {}, {}, {}, {}, {}
    for name in wanted:
        spec, s = info.feature(name), stats.get(name)
        if name == info.label:
            continue
        if s is not None and s.missing:
            lacked[name] = int(s.missing)
        masked = missing == "mask" and spec.missing > 0
        if not spec.is_scalar:
            left[name] = "a list: give it to the model as it comes"
        elif spec.dtype == "bytes" and spec.text and name in info.vocabularies:
            sizes[name] = len(info.vocabulary(name)) + 1
            if masked:
                imputed[name] = _most_frequent_id(info, name, s)
        elif spec.dtype == "bytes":
            left[name] = "text without a recorded vocabulary (or bytes): no ids"
        elif s is None or s.mean is None:
            left[name] = "no finite values to standardize"
        else:
            filled = s if missing == "mask" else _with_fill(s, spec)
            numbers[name] = (float(filled.mean), float(filled.std))
            if masked:
                imputed[name] = float(s.mean)
    return Preprocessing(numbers, sizes, tuple(info.labels or ()), lacked, left, imputed)


def _most_frequent_id(info, name: str, s) -> int | None:
    """The id (position in the recorded vocabulary, plus one) of the split's most frequent value."""
    if s is None or not s.top:
        return None
    vocabulary = info.vocabulary(name)
    return vocabulary.index(s.top[0].value) + 1 if s.top[0].value in vocabulary else None
