"""The dataset contract: the metadata file that conversion writes and the runtime reads.

This module is pure (no TensorFlow, no Beam, no I/O) so that both sides can import it
cheaply: `beam_jobs` writes `DatasetInfo.to_json()` next to its shards, `ingest`
reads it back with `DatasetInfo.from_json()`. A directory without the metadata file is
an incomplete dataset.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

__all__ = [
    "FORMAT_VERSION",
    "METADATA_FILENAME",
    "QUARANTINE_DIRNAME",
    "TEMP_PREFIX",
    "DTYPES",
    "FeatureSpec",
    "ShardInfo",
    "SplitInfo",
    "DatasetInfo",
    "shard_filename",
]

FORMAT_VERSION = 1
METADATA_FILENAME = "dataset_info.json"
QUARANTINE_DIRNAME = "quarantine"
# Work in progress lives under DIR/_ingest_tmp-<job>/ (no leading dot: glob skips those).
TEMP_PREFIX = "_ingest_tmp-"
DTYPES = ("int64", "float32", "bytes")
COMPRESSIONS = ("none", "gzip")
_SPLIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def shard_filename(split: str, index: int, count: int, compression: str = "none") -> str:
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}-{index:05d}-of-{count:05d}{suffix}"


def check_split_name(name: str) -> str:
    if not _SPLIT_NAME.match(name):
        raise ValueError(
            f"split name {name!r} is invalid: use a letter followed by letters, digits or '_'"
        )
    return name


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature of every record.

    `shape` is `()` for a scalar, `(k,)` for a fixed-length list and `(None,)` for a
    variable-length list. `missing` counts records where the feature is absent; the
    runtime fills absent values of dense features with `default`. `role` says what the
    feature means where that matters ("label", "image/encoded", ...). `text` marks bytes
    that hold UTF-8 text rather than binary data.
    """

    name: str
    dtype: str
    shape: tuple = ()
    missing: int = 0
    default: Any = None
    role: str | None = None
    text: bool = False
    min_length: int | None = None
    max_length: int | None = None

    def __post_init__(self):
        if not self.name:
            raise ValueError("feature name must be non-empty")
        if self.dtype not in DTYPES:
            raise ValueError(
                f"feature {self.name!r}: dtype must be one of {DTYPES}, got {self.dtype!r}"
            )
        shape = tuple(self.shape)
        if len(shape) > 1 or (shape and shape[0] is not None and int(shape[0]) < 0):
            raise ValueError(
                f"feature {self.name!r}: shape must be (), (k,) or (None,), got {self.shape!r}"
            )
        object.__setattr__(self, "shape", shape)
        if self.default is None:
            object.__setattr__(self, "default", _natural_default(self.dtype))

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    @property
    def is_variable_length(self) -> bool:
        return self.shape == (None,)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "FeatureSpec":
        d = dict(d)
        d["shape"] = tuple(d.get("shape", ()))
        return cls(**d)


def _natural_default(dtype: str):
    return {"int64": 0, "float32": 0.0, "bytes": ""}[dtype]


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    filename: str
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    name: str
    shards: tuple

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "records": self.records,
            "bytes": self.bytes,
            "shards": [dataclasses.asdict(s) for s in self.shards],
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "SplitInfo":
        return cls(name=d["name"], shards=tuple(ShardInfo(**s) for s in d["shards"]))


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Everything the runtime needs to know about a converted dataset."""

    features: tuple
    splits: tuple
    compression: str = "none"
    label: str | None = None
    source: Mapping = dataclasses.field(default_factory=dict)
    options: Mapping = dataclasses.field(default_factory=dict)
    quarantine: Mapping = dataclasses.field(default_factory=dict)
    created: str = ""
    format_version: int = FORMAT_VERSION
    # Class names of an integer label: labels[i] is the name of class i (sorted at conversion).
    labels: tuple = ()
    # Image datasets: {"feature": the encoded-image feature, "stored": the storing options,
    # "formats": images per stored format, "actions": re-encoded/resized/... counts}.
    # Empty for tabular data.
    image: Mapping = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"feature names must be unique, got {names}")
        if self.label is not None and self.label not in names:
            raise ValueError(f"label {self.label!r} is not a feature; features: {names}")
        if self.image and self.image.get("feature") not in names:
            raise ValueError(f"image feature {self.image.get('feature')!r} is not a feature; features: {names}")

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(
            f"no feature {name!r} in this dataset; features: {[f.name for f in self.features]}"
        )

    def split(self, name: str) -> SplitInfo:
        for s in self.splits:
            if s.name == name:
                return s
        raise KeyError(
            f"no split {name!r} in this dataset; splits: {[s.name for s in self.splits]}"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "format_version": self.format_version,
                "created": self.created,
                "compression": self.compression,
                "label": self.label,
                "features": [f.to_json() for f in self.features],
                "splits": [s.to_json() for s in self.splits],
                "source": dict(self.source),
                "options": dict(self.options),
                "quarantine": dict(self.quarantine),
                **({"labels": list(self.labels)} if self.labels else {}),
                **({"image": dict(self.image)} if self.image else {}),
            },
            indent=2,
            sort_keys=False,
        )

    @classmethod
    def from_json(cls, text: str) -> "DatasetInfo":
        d = json.loads(text)
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"dataset metadata has format_version {version!r}; this version of ingest "
                f"reads format_version {FORMAT_VERSION}: reconvert the dataset or upgrade ingest"
            )
        return cls(
            features=tuple(FeatureSpec.from_json(f) for f in d["features"]),
            splits=tuple(SplitInfo.from_json(s) for s in d["splits"]),
            compression=d.get("compression", "none"),
            label=d.get("label"),
            source=d.get("source", {}),
            options=d.get("options", {}),
            quarantine=d.get("quarantine", {}),
            created=d.get("created", ""),
            format_version=version,
            labels=tuple(d.get("labels", ())),
            image=d.get("image", {}),
        )
