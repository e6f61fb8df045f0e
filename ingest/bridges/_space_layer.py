"""The Keras layer `ingest.feature_space` returns: `keras.utils.FeatureSpace`, which also
imputes the features some records lacked and adds a missing indicator for each, as
scikit-learn's `SimpleImputer(add_indicator=True)` does, and keeps embedding ids apart
from its concatenation.

Imported only once Keras is (`ingest.feature_space` imports it lazily).

The batch tells which rows lacked a value: `make_dataset(missing="mask")` gives feature
`f` a `f_missing` bool tensor beside it, True where the record had no value and `f` holds
the fill (0, 0.0, ""). The fill cannot tell, since a real 0 looks the same.
"""

from __future__ import annotations

import keras
from keras.src.layers.preprocessing.feature_space import TFDConcat
from keras.utils import FeatureSpace

from ingest import contract

MISSING_SUFFIX = contract.MASK_SUFFIX  # make_dataset's mask of feature f is f + MISSING_SUFFIX
CONCAT_KEY = "concat"  # output_mode="concat" with embedding ids: the concatenation's key


def _tf():
    import tensorflow as tf

    return tf


@keras.saving.register_keras_serializable(package="ingest")
class ImputeMissing(keras.layers.Layer):
    """`value` where the mask is True, the input elsewhere. A float `value` (a mean, a
    median) turns an integer input into float32 first, as the number layers after it
    would; a float input keeps its dtype (float64 is not bent to float32 here)."""

    def __init__(self, value, **kwargs):
        super().__init__(**kwargs)
        self.value = value
        self._convert_input_args = False  # strings and bools stay what they are
        self._allow_non_tensor_positional_args = True

    def call(self, x, mask):
        tf = _tf()
        x = tf.convert_to_tensor(x)
        if isinstance(self.value, float) and x.dtype.is_integer:  # a float64 stays float64
            x = tf.cast(x, tf.float32)
        return tf.where(tf.cast(mask, tf.bool), tf.constant(self.value, x.dtype), x)

    def compute_output_spec(self, x, mask):
        integer = "int" in str(x.dtype)
        return keras.KerasTensor(x.shape, dtype="float32" if isinstance(self.value, float) and integer else x.dtype)

    def get_config(self):
        return {**super().get_config(), "value": self.value}


@keras.saving.register_keras_serializable(package="ingest")
class MissingIndicator(keras.layers.Layer):
    """The mask as float32 0/1: one column of the output per feature with missing values."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._convert_input_args = False

    def call(self, mask):
        tf = _tf()
        return tf.cast(tf.cast(mask, tf.bool), tf.float32)

    def compute_output_spec(self, mask):
        return keras.KerasTensor(mask.shape, dtype="float32")


@keras.saving.register_keras_serializable(package="ingest")
class ImputingFeatureSpace(FeatureSpace):
    """A FeatureSpace whose features in `missing` ({name: value to impute, or None to
    impute nothing}) take their mask `name + "_missing"` as input: the preprocessing sees
    `value` in the rows it marks, and the output gets `name + "_missing"` (0/1) beside
    the feature. Features whose spec has `output_mode="int"` (ids for an embedding)
    cannot be concatenated: with output_mode "concat" the output is then a dict, the
    concatenation under "concat" and each such feature's ids under its name."""

    def __init__(self, features, output_mode="concat", missing=None, **kwargs):
        super().__init__(features, output_mode=output_mode, **kwargs)
        self.missing = dict(missing or {})
        unknown = sorted(set(self.missing) - set(self.features))
        if unknown:
            raise ValueError(f"missing names {unknown}, which are not features of the space: {sorted(self.features)}")
        self.imputers = {
            name: ImputeMissing(value, name=f"impute_{name}")
            for name, value in self.missing.items()
            if value is not None
        }
        self.indicators = {name: MissingIndicator(name=f"indicate_{name}_missing") for name in self.missing}
        for name in self.missing:
            self.inputs[name + MISSING_SUFFIX] = keras.Input(shape=(1,), dtype="bool", name=name + MISSING_SUFFIX)
        self.ids = (
            sorted(n for n, f in self.features.items() if f.output_mode == "int") if output_mode == "concat" else []
        )
        self.indicator_concat = TFDConcat(axis=-1)  # FeatureSpace's own concatenation, for the indicators
        if self.ids and CONCAT_KEY in self.features:
            raise ValueError(
                f"feature {CONCAT_KEY!r} would share its key with the concatenation beside the embedding ids "
                f"{self.ids}: pass output_mode='dict'"
            )

    def __call__(self, data):
        if isinstance(data, dict):
            absent = [n for n in self.inputs if n not in data]
            if absent:
                raise ValueError(_absent_message(absent, sorted(data)))
            data = {name: data[name] for name in self.inputs}  # the rest of the batch is not an input
            if self.ids and all(len(getattr(x, "shape", ())) == 0 for x in data.values()):
                # One record: FeatureSpace squeezes a concatenation it made a batch of one, but
                # not one held in a dict beside the ids.
                tf = _tf()
                out = super().__call__({name: tf.reshape(x, [1]) for name, x in data.items()})
                return {name: tf.squeeze(x, 0) for name, x in out.items()}
        return super().__call__(data)

    def _preprocess_features(self, features):
        out = {}
        for name in self.features:
            x = features[name]
            if name in self.missing:
                mask = features[name + MISSING_SUFFIX]
                out[name + MISSING_SUFFIX] = self.indicators[name](mask)
                if name in self.imputers:
                    x = self.imputers[name](x, mask)
            out[name] = self.preprocessors[name](x)
        return out

    def _merge_features(self, preprocessed_features, crossed_features):
        apart = {n + MISSING_SUFFIX for n in self.missing} | set(self.ids)
        rest = {n: x for n, x in preprocessed_features.items() if n not in apart}
        dense = bool(rest or crossed_features)
        merged = super()._merge_features(rest, crossed_features) if dense else {}
        if self.output_mode == "dict":
            return {**merged, **{n: x for n, x in preprocessed_features.items() if n in apart}}
        indicators = [preprocessed_features[n + MISSING_SUFFIX] for n in sorted(self.missing)]
        if indicators:
            merged = self.indicator_concat(([merged] if dense else []) + indicators)
        if not self.ids:
            return merged
        matrix = {CONCAT_KEY: merged} if dense or indicators else {}
        return {**matrix, **{n: preprocessed_features[n] for n in self.ids}}

    def get_config(self):
        return {**super().get_config(), "missing": dict(self.missing)}


def _absent_message(absent: list, given: list) -> str:
    masks = [n for n in absent if n.endswith(MISSING_SUFFIX)]
    text = f"the batch has no {absent}; it has {given}."
    if masks:
        text += (
            f" {masks} are the masks of features some records lacked, which make_dataset(missing='mask') "
            "yields: pass the batch's dict whole (space(x)), or build the space with missing='fill'"
        )
    return text
