"""A schema carried from span to span (`--schema_from DATASET`, `WriteDataset(schema_from=...)`).

Data that arrives daily is converted once a day into a dataset of its own (a span). A
conversion that infers its types decides from that day's values alone: a day whose
column holds only integers gets int64, the next float32; a day without snow numbers the
weather classes differently; and spans that disagree cannot be read together. Carried,
the features (names, order, dtypes, shapes, defaults, text) and the label with its
classes are those of an existing dataset's metadata, the same every day:

- a value that does not fit its feature's type is quarantined with its source, row,
  column and reason, as any bad value is (ints fit float32 when float32 holds them
  exactly, the rule of float32 columns in `column_types`; text and binary are both bytes);
- a text label's class names are kept as they are, so a class id means the same thing
  every day; a label value that is none of them is quarantined (`unknown_label`);
- a feature the input lacks, or a column the schema lacks, is an error naming it.

This module reads the schema (`load`) and holds the pure checks and fittings the sources
and the job use; what differs by source stays in the source (`Source.carrying`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import ConversionError, is_denied, storage_error
from beam_jobs.output import directory as output_dir
from beam_jobs.output import shard_plan
from beam_jobs.sources import column_types
from ingest import contract

__all__ = ["CarriedSchema", "of_options", "load", "describe", "fit_column", "unknown_labels"]

logger = logging.getLogger(__name__)

# The classes an unknown-label reason lists; a longer list ends with how many there are.
_CLASSES_SHOWN = 20


@dataclasses.dataclass(frozen=True)
class CarriedSchema:
    """The schema of the dataset at `dataset`, as the next span's conversion takes it."""

    dataset: str  # the directory, as --schema_from gave it
    features: tuple  # contract.FeatureSpec, in the dataset's order
    label: str | None
    labels: tuple  # a text label's class names; a class id is its position
    job: str | None = None  # the job that wrote that dataset (its source["job"])
    # How that dataset's records are laid out: (layout, block_rows, compression). Not carried
    # (a span may be written otherwise on purpose), but spans that differ are not read as one.
    storage: tuple = ()
    # ((split, fraction), ...) that dataset was split by: the default of a span's --splits.
    splits: tuple = ()
    # {feature: its vocabulary, a tuple of str}: a value's id never changes from span to span.
    vocabularies: Mapping = dataclasses.field(default_factory=dict)
    # The column that dataset was split by (its --split_key): the default of a span's, so
    # that a key (a user) stays in one split in every span. None: split by the record.
    split_key: str | None = None

    @property
    def names(self) -> tuple:
        return tuple(f.name for f in self.features)

    @property
    def types(self) -> dict:
        """{name: (dtype, shape)}, in the schema's order."""
        return {f.name: (f.dtype, f.shape) for f in self.features}

    @property
    def binary(self) -> frozenset:
        """The bytes features that hold binary data, not text."""
        return frozenset(f.name for f in self.features if f.dtype == "bytes" and not f.text)

    @property
    def defaults(self) -> dict:
        """{name: default} the writer fills missing values with (the block layout)."""
        return {f.name: f.default for f in self.features}

    def provenance(self) -> dict:
        """What the new metadata's `source["schema_from"]` records: where the schema came from."""
        return {"dataset": self.dataset, "job": self.job}

    def check_label(self, label: str | None) -> None:
        """A --label must be the schema's (omitting it takes the schema's)."""
        if label is not None and label != self.label:
            has = f"whose label is {self.label!r}" if self.label is not None else "which has no label"
            raise ConversionError(
                f"--label {label!r} disagrees with --schema_from {self.dataset}, {has}: the schema's label is the "
                "label of every span; omit --label, or convert without --schema_from to start a new schema"
            )

    def check_columns(self, columns, *, of: str, selected: bool, drop_hint: str) -> None:
        """Refuses a column set that is not the schema's features.

        `columns`: the columns read; `of`: what they are the columns of, for messages
        (e.g. "--input 'day/*.csv'"); `selected`: whether --columns chose them;
        `drop_hint`: how to drop a column the schema lacks.
        """
        missing = [c for c in self.names if c not in columns]
        if missing:
            how = "--columns leaves out" if selected else f"{of} lacks"
            fix = "add them to --columns" if selected else "every span must have every feature of the schema"
            raise ConversionError(
                f"{how} column(s) {missing}, feature(s) of --schema_from {self.dataset} (its features: "
                f"{list(self.names)}); the columns read: {list(columns)}: {fix}"
            )
        extra = [c for c in columns if c not in self.names]
        if extra:
            which = "--columns names" if selected else f"{of} has"
            raise ConversionError(
                f"{which} column(s) {extra} that --schema_from {self.dataset} lacks (its features: "
                f"{list(self.names)}): {drop_hint}"
            )

    def unknown_label_reason(self, value) -> str:
        shown = list(self.labels[:_CLASSES_SHOWN])
        more = f" and {len(self.labels) - _CLASSES_SHOWN} more" if len(self.labels) > _CLASSES_SHOWN else ""
        text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
        return (
            f"label column {self.label!r}: {text!r} is not one of the classes of --schema_from {self.dataset}: "
            f"{shown}{more}; a new class needs a new schema (convert without --schema_from)"
        )


def of_options(opts) -> CarriedSchema | None:
    """The schema a job's `schema_from` names, checked against its --label; None without one."""
    if opts.schema_from is None:
        return None
    schema = load(opts.schema_from)
    schema.check_label(opts.label)
    return schema


def load(dataset: str) -> CarriedSchema:
    """The schema of a converted dataset (local or gs://), read from its metadata file."""
    path = FileSystems.join(dataset, contract.METADATA_FILENAME)
    try:
        text = output_dir.read_text(path)
    except Exception as e:  # Beam raises several types; a missing file among them
        if not is_denied(e) and not _exists(path):
            if dataset.endswith("/" + contract.METADATA_FILENAME):
                raise ConversionError(
                    f"--schema_from {dataset} names a metadata file: name its dataset's directory, "
                    f"--schema_from {dataset.rsplit('/', 1)[0]}"
                ) from e
            raise ConversionError(
                f"--schema_from {dataset} is not a converted dataset: it has no {contract.METADATA_FILENAME} "
                "(a conversion that did not finish writes none); name the directory of a dataset converted before"
            ) from e
        raise storage_error("read", "--schema_from", path, e) from e
    try:
        info = contract.DatasetInfo.from_json(text)
    except ValueError as e:
        raise ConversionError(f"--schema_from {dataset}: its {contract.METADATA_FILENAME} is not valid: {e}") from e
    if info.image:
        raise ConversionError(
            f"--schema_from {dataset} is an image dataset: --schema_from takes the schema of a tabular one "
            "(CSV, Parquet or WriteDataset rows)"
        )
    job = info.source.get("job")
    storage = (info.layout, info.block_rows, info.compression)
    splits = _recorded_splits(info, dataset)
    vocabularies = {name: _vocabulary(dataset, name, v) for name, v in info.vocabularies.items()}
    return CarriedSchema(
        dataset,
        tuple(info.features),
        info.label,
        tuple(info.labels),
        job,
        storage,
        splits,
        vocabularies,
        _recorded_split_key(info, dataset),
    )


def _vocabulary(dataset: str, name: str, entry: Mapping) -> tuple:
    path = FileSystems.join(dataset, entry["file"])
    try:
        data = output_dir.read_bytes(path)
    except Exception as e:  # Beam raises several types; a missing file among them
        raise ConversionError(
            f"--schema_from {dataset}: its vocabulary file {path} cannot be read ({e}); copy it along with the "
            "dataset, or reconvert that dataset"
        ) from e
    try:
        return contract.parse_vocabulary(data, entry)
    except ValueError as e:
        raise ConversionError(
            f"--schema_from {dataset}: its vocabulary file {path}, of feature {name!r}, is not the one converted: "
            f"{e}. Restore it, or reconvert that dataset (a new schema: convert without --schema_from)"
        ) from e


def _recorded_splits(info: contract.DatasetInfo, dataset: str) -> tuple:
    """The splits a dataset's conversion recorded (`options.splits`); () if it recorded none."""
    recorded = info.options.get("splits")
    if recorded is None:
        return ()
    try:
        return tuple(shard_plan.parse_splits(",".join(f"{k}={v}" for k, v in dict(recorded).items())).items())
    except (TypeError, ValueError) as e:
        logger.warning(
            "--schema_from %s: its %s records splits %r, which are not valid (%s): not carried; pass --splits",
            dataset,
            contract.METADATA_FILENAME,
            recorded,
            e,
        )
        return ()


def _recorded_split_key(info: contract.DatasetInfo, dataset: str) -> str | None:
    """The --split_key a dataset's conversion recorded (`options.split_key`); None if none."""
    key = info.options.get("split_key")
    if key is None:
        return None
    names = [f.name for f in info.features]
    if not isinstance(key, str) or key not in names:
        logger.warning(
            "--schema_from %s: its %s records split_key %r, which is not one of its features %s: not carried; "
            "pass --split_key",
            dataset,
            contract.METADATA_FILENAME,
            key,
            names,
        )
        return None
    return key


def _exists(path: str) -> bool:
    try:
        return FileSystems.exists(path)
    except Exception:  # unreachable storage: the read's own error says why
        return True


def describe(dtype: str, shape: tuple) -> str:
    """'int64', 'lists of int64', 'lists of 3 int64'."""
    if shape == ():
        return dtype
    return f"lists of {dtype}" if shape[0] is None else f"lists of {shape[0]} {dtype}"


# --- fitting Arrow columns to the schema's types ------------------------------------------


def fit_column(arr: pa.Array, name: str, have: tuple, want: tuple, *, dataset: str) -> tuple:
    """A canonical column (`column_types.canonical_arrow_column`) of type `have` -> the same
    values as type `want` ((dtype, shape) each), and [(row, reason)] of the rows whose value
    does not fit, which come back null for the caller to quarantine.

    Fits, exactly: ints as float32 (float64) when float32 (float64) holds each exactly;
    float32 as float64; float64 as float32 within float32's range (where float32 changes a
    value, `column_types.float32_changes`, the job warns how much); lists of k values as
    variable-length lists, and variable-length lists of k values as lists of k. Nothing
    else does: a float is no int64, a list no scalar, a number no bytes.
    """
    if have == want:
        return arr, []
    (have_dtype, have_shape), (want_dtype, want_shape) = have, want
    valid = _mask(arr.is_valid())
    widens = have_dtype == want_dtype or (have_dtype in _NUMBERS and want_dtype in column_types.FLOAT_BITS)
    if not widens or (have_shape == ()) != (want_shape == ()):
        rows = np.flatnonzero(valid)
        reasons = [
            f"column {name!r}: {_shown(arr[int(i)].as_py())} is {describe(have_dtype, have_shape)}, but its type in "
            f"--schema_from {dataset} is {describe(want_dtype, want_shape)}"
            for i in rows
        ]
        return pa.nulls(len(arr), _arrow_type(want_dtype, want_shape)), list(zip(rows.tolist(), reasons))
    if have_shape == ():
        out, unfit = _numbers_as(arr, have_dtype, want_dtype)
        bad = [(int(i), _unfit_reason(name, arr[int(i)].as_py(), dataset, want_dtype)) for i in np.flatnonzero(unfit)]
        return out, bad
    return _fit_lists(arr, name, valid, have_dtype, want, dataset)


_NUMBERS = ("int64", "float32", "float64")


def _numbers_as(values: pa.Array, have_dtype: str, want_dtype: str) -> tuple:
    """Numbers of one type as another float type -> (values, mask of those it cannot hold,
    which are null now): ints it cannot hold exactly, finite doubles beyond float32."""
    if have_dtype == "int64":
        unfit = column_types.inexact_in_float(values, column_types.FLOAT_BITS[want_dtype])
    elif want_dtype == "float32" and have_dtype == "float64":
        narrow = pc.cast(values, pa.float32(), safe=False)
        unfit = _mask(pc.and_(pc.is_inf(narrow), pc.is_finite(values)))
    else:
        unfit = np.zeros(len(values), bool)
    return pc.cast(_nulled(values, unfit), _ARROW[want_dtype], safe=False), unfit


def _fit_lists(arr: pa.Array, name: str, valid: np.ndarray, have_dtype: str, want: tuple, dataset: str) -> tuple:
    want_dtype, (k,) = want
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        offsets = np.arange(len(arr) + 1, dtype=np.int64) * size
    else:
        arr = arr.cast(pa.large_list(arr.type.value_type))
        values = arr.values
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
    lengths = np.diff(offsets)
    reasons: dict = {}  # row -> why its value does not fit
    if k is not None:
        for i in np.flatnonzero(valid & (lengths != k)):
            reasons[int(i)] = (
                f"column {name!r}: {_shown(arr[int(i)].as_py())} holds {_values(lengths[i])}, but its type in "
                f"--schema_from {dataset} is {describe(*want)}"
            )
    if have_dtype != want_dtype:  # numbers into a float type
        parents = np.repeat(np.arange(len(arr)), lengths)
        fitted, unfit = _numbers_as(values, have_dtype, want_dtype)
        for j in np.flatnonzero(unfit):
            reasons.setdefault(int(parents[j]), _unfit_reason(name, values[int(j)].as_py(), dataset, want_dtype))
        values = fitted
    keep = valid.copy()
    keep[list(reasons)] = False
    if k is None:
        out = pa.LargeListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~keep))
    else:
        # Each kept row's k values; k nulls for the others (a list of k needs its slots).
        starts = np.where(keep, offsets[:-1], -1)
        index = (starts[:, None] + np.arange(k)).ravel() if k else np.zeros(0, np.int64)
        gone = np.repeat(~keep, k)
        taken = values.take(pa.array(np.where(gone, 0, index), mask=gone)) if len(index) else values.slice(0, 0)
        out = pa.FixedSizeListArray.from_arrays(taken, k, mask=pa.array(~keep))
    return out, sorted(reasons.items())


def _unfit_reason(name: str, value, dataset: str, dtype: str) -> str:
    if isinstance(value, float):
        return (
            f"column {name!r}: {value!r} is a finite number beyond {dtype}'s range, its type in --schema_from {dataset}"
        )
    return f"column {name!r}: {value} is not exact in {dtype}, its type in --schema_from {dataset}"


def _values(n: int) -> str:
    return f"{n} value" if n == 1 else f"{n} values"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mask(arr) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), bool)


def _nulled(arr: pa.Array, rows: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(rows), pa.scalar(None, arr.type), arr) if rows.any() else arr


_ARROW = {"int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64(), "bytes": pa.large_binary()}


def _arrow_type(dtype: str, shape: tuple) -> pa.DataType:
    if shape == ():
        return _ARROW[dtype]
    return pa.large_list(_ARROW[dtype]) if shape[0] is None else pa.list_(_ARROW[dtype], shape[0])


# --- the label's classes ----------------------------------------------------------------


def unknown_labels(labels: pa.Array, classes: tuple) -> np.ndarray:
    """Per row, whether a text label's value is none of `classes` (missing ones are not)."""
    known = pa.array([c.encode("utf-8") for c in classes], pa.large_binary())
    values = labels if pa.types.is_large_binary(labels.type) else labels.cast(pa.large_binary())
    return _mask(pc.and_(values.is_valid(), pc.invert(pc.is_in(values, value_set=known))))
