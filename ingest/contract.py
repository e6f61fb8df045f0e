"""The dataset contract: the metadata file that conversion writes and the runtime reads.

This module is pure (no TensorFlow, no Beam, no I/O) so that both sides can import it
cheaply: `beam_jobs` writes `DatasetInfo.to_json()` next to its shards, `ingest`
reads it back with `DatasetInfo.from_json()`. A directory without the metadata file is
an incomplete dataset.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import re
import struct
import zlib
from typing import Any, Mapping

import numpy as np

from ingest.statistics import Statistics, json_number, number_of

__all__ = [
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "FLOAT64_SINCE",
    "FLOAT_DTYPES",
    "format_version_of",
    "float64_bits",
    "LAYOUTS",
    "METADATA_FILENAME",
    "QUARANTINE_DIRNAME",
    "VOCABULARIES_DIRNAME",
    "TEMP_PREFIX",
    "DTYPES",
    "FeatureSpec",
    "ShardInfo",
    "SplitInfo",
    "DatasetInfo",
    "shard_filename",
    "index_filename",
    "FINGERPRINT_BYTES",
    "shard_fingerprint",
    "BLOCK_INDEX_MAGIC",
    "BLOCK_INDEX_VERSION",
    "block_index_size",
    "encode_block_index",
    "decode_block_index",
    "BLOCK_ROWS_FEATURE",
    "ROW_LENGTHS_SUFFIX",
    "MISSING_SUFFIX",
    "MISSING_MODES",
    "MASK_SUFFIX",
    "CODES_SUFFIX",
    "CODES_SINCE",
    "IDS_SUFFIX",
    "VOCABULARY_LIMIT",
    "vocabulary_filename",
    "vocabulary_entry",
    "parse_vocabulary",
    "block_feature_names",
]

# 5 adds float64 features (stored as int64 bit patterns, docs/block_format.md); it is
# written only by a dataset that has one, so that older readers still read the others.
# 4 records a vocabulary of each text feature (`vocabularies`, their files) and, in the
# block layout, each block dictionary's ids in it (`F/ids`); 3 dictionary-encodes the
# block layout's bytes columns (`F/codes`); 2 added the block layout (`layout`,
# `block_rows`, each shard's `blocks`); 1 is the rows layout. This version reads all five.
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
CODES_SINCE = 3  # the first format whose blocks carry `F/codes`
FLOAT64_SINCE = 5  # the first format with float64 features
LAYOUTS = ("rows", "blocks")
METADATA_FILENAME = "dataset_info.json"
QUARANTINE_DIRNAME = "quarantine"
# Work in progress lives under DIR/_ingest_tmp-<job>/ (no leading dot: glob skips those).
TEMP_PREFIX = "_ingest_tmp-"
# float64 holds what float32 would change (`123456789.12`); TFRecord's float_list holds
# only 32-bit floats, so its values are stored as the int64 bit patterns of the doubles.
DTYPES = ("int64", "float32", "float64", "bytes")
FLOAT_DTYPES = ("float32", "float64")
# The block layout's own features (docs/block_format.md): a block's row count, and per
# column F its variable-length row lengths, the in-block positions of missing rows, and
# (bytes columns) each value's index into the block's dictionary.
BLOCK_ROWS_FEATURE = "__rows__"
ROW_LENGTHS_SUFFIX = "/row_lengths"
MISSING_SUFFIX = "/missing"
CODES_SUFFIX = "/codes"
IDS_SUFFIX = "/ids"  # a block dictionary's ids in the feature's vocabulary (0: not in it)
# How the runtime gives a record's missing value (make_dataset, loader, feature_space and
# preprocessing take the same `missing=`): "mask" adds a bool feature NAME + MASK_SUFFIX,
# True where the record lacked NAME, beside each feature the metadata counts missing
# values for; "fill" gives the default alone.
MISSING_MODES = ("mask", "fill")
MASK_SUFFIX = "_missing"
# The most values a text feature's vocabulary holds; a feature with more distinct values
# gets none: hash it instead. Ids, URLs and other values that rarely repeat would make the
# vocabulary as large as the column (the benchmark's 500k-row high-cardinality corpus:
# 73 MB of vocabulary files beside 98 MB of shards) for embeddings each trained on a row or
# two. 2**17 ids of a 64-wide float32 embedding take 32 MB.
VOCABULARY_LIMIT = 1 << 17
VOCABULARIES_DIRNAME = "vocabularies"


def format_version_of(features) -> int:
    """The format a dataset of `features` is written in: FLOAT64_SINCE with a float64
    feature, else the one before, which readers older than float64 read."""
    return FLOAT64_SINCE if any(f.dtype == "float64" for f in features) else FLOAT64_SINCE - 1


def float64_bits(value: float) -> int:
    """A float64 value as the int64 bit pattern that stores it (NaN payloads and -0.0 kept)."""
    return int(np.array(value, np.float64).view(np.int64))


def block_feature_names(name: str) -> tuple:
    """The block layout's names derived from a column's, which no column may take."""
    return (name + ROW_LENGTHS_SUFFIX, name + MISSING_SUFFIX, name + CODES_SUFFIX, name + IDS_SUFFIX)


def vocabulary_filename(position: int) -> str:
    """The vocabulary file of the feature at `position` in the metadata's features."""
    return f"{VOCABULARIES_DIRNAME}/{position:05d}.json"


def vocabulary_entry(rel: str, data: bytes, size: int) -> dict:
    """The metadata's entry of a vocabulary file written as `data` (a JSON list of `size`
    values): its path, its size, and the SHA-256 of its bytes, which `parse_vocabulary`
    checks (a reordered file would give every id another value)."""
    return {"file": rel, "size": size, "sha256": hashlib.sha256(data).hexdigest()}


def parse_vocabulary(data: bytes, entry: Mapping) -> tuple:
    """The values of a vocabulary file, checked against its metadata entry: a JSON list of
    distinct strings that UTF-8 holds, as many as `size`, and (datasets converted since it
    is recorded) the bytes whose SHA-256 the conversion recorded. Raises ValueError saying
    what does not hold."""
    try:
        values = json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        raise ValueError(f"it is not a JSON list of strings ({e})") from e
    if not isinstance(values, list):
        raise ValueError(f"it holds {_found(values)}, not a JSON list of strings")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"its value {i} is {_found(v)}, not a string")
    try:
        "".join(values).encode("utf-8")
    except UnicodeEncodeError:
        i = next(i for i, v in enumerate(values) if not _encodable(v))
        raise ValueError(f"its value {i} {values[i]!r:.80} is not text (a lone surrogate, which UTF-8 cannot hold)")
    if len(set(values)) != len(values):
        seen: dict = {}
        for i, v in enumerate(values):
            if v in seen:
                raise ValueError(f"it lists {v!r:.80} twice (values {seen[v]} and {i}): each value must have one id")
            seen[v] = i
    if len(values) != entry["size"]:
        raise ValueError(f"it holds {len(values)} values, where {METADATA_FILENAME} records {entry['size']}")
    digest = entry.get("sha256")
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(
            f"its SHA-256 is not the one {METADATA_FILENAME} records: it was changed since the conversion (reordered, "
            "edited or replaced), and its ids would mean other values"
        )
    return tuple(values)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


COMPRESSIONS = ("none", "gzip")
_SPLIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def shard_filename(split: str, index: int, count: int, compression: str = "none") -> str:
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}-{index:05d}-of-{count:05d}{suffix}"


def index_filename(shard: str) -> str:
    """The block index written beside an uncompressed blocks-layout shard (docs/block_format.md)."""
    return shard + ".index"


# A shard's fingerprint: the SHA-256 of its size and its first and last FINGERPRINT_BYTES
# bytes, recorded at conversion and checked when the runtime opens the shard. Cheap (two
# small reads, whatever the shard's size), it tells a shard swapped in from another
# conversion (another job's records, CRCs and lengths at both ends) from the one written;
# the records between are checked by their TFRecord CRCs as they are read.
FINGERPRINT_BYTES = 4096


def shard_fingerprint(size: int, head: bytes, tail: bytes) -> str:
    """The fingerprint of a shard of `size` bytes whose first and last FINGERPRINT_BYTES
    bytes (all of it, each, when it is smaller) are `head` and `tail`."""
    return hashlib.sha256(struct.pack("<Q", size) + head + tail).hexdigest()


# A shard's block index (docs/block_format.md): every block's frame length, so a reader
# finds any block's byte offset without reading the shard's frame headers, which on
# object storage is a download of the shard.
BLOCK_INDEX_MAGIC = b"IGBLKIDX"
BLOCK_INDEX_VERSION = 1
_INDEX_HEAD = struct.Struct("<8sII")  # magic, version, CRC-32 of all that follows
_INDEX_COUNT = struct.Struct("<Q")  # blocks; their frame lengths (int64) follow
_MIN_FRAME = 16  # the frame of an empty record: length (8), its CRC (4), the record's CRC (4)


def block_index_size(blocks: int) -> int:
    """The bytes of the block index of a shard of `blocks` blocks."""
    return _INDEX_HEAD.size + _INDEX_COUNT.size + 8 * blocks


def encode_block_index(frame_lengths) -> bytes:
    """A shard's block index: its blocks' TFRecord frame lengths (header and CRCs included), in shard order."""
    lengths = np.asarray(frame_lengths, np.int64)
    if lengths.ndim != 1 or (lengths < _MIN_FRAME).any():
        raise ValueError(f"frame lengths must be a list of integers >= {_MIN_FRAME}, got {frame_lengths!r:.200}")
    body = _INDEX_COUNT.pack(len(lengths)) + lengths.astype("<i8").tobytes()
    return _INDEX_HEAD.pack(BLOCK_INDEX_MAGIC, BLOCK_INDEX_VERSION, zlib.crc32(body)) + body


def decode_block_index(data: bytes, *, blocks: int, shard_bytes: int) -> np.ndarray:
    """The frame lengths a block index holds, checked against its shard's metadata.

    Raises ValueError saying what does not hold: the index must be whole (its size
    follows from its count, its CRC-32 matches), list `blocks` frames, and the frames
    must add up to `shard_bytes`, so that no offset read from it is wrong.
    """
    head = block_index_size(0)
    if len(data) < head:
        raise ValueError(f"it holds {len(data)} bytes, less than its {head}-byte header")
    magic, version, crc = _INDEX_HEAD.unpack_from(data)
    if magic != BLOCK_INDEX_MAGIC:
        raise ValueError(f"it does not start with {BLOCK_INDEX_MAGIC!r} (found {magic!r}): it is not a block index")
    if version != BLOCK_INDEX_VERSION:
        raise ValueError(f"it has version {version}; this version of ingest reads version {BLOCK_INDEX_VERSION}")
    (count,) = _INDEX_COUNT.unpack_from(data, _INDEX_HEAD.size)
    if len(data) != head + 8 * count:
        raise ValueError(
            f"it holds {len(data)} bytes where its {count} blocks take {head + 8 * count}: it was cut short or "
            "appended to"
        )
    if zlib.crc32(memoryview(data)[_INDEX_HEAD.size :]) != crc:
        raise ValueError("its CRC-32 does not match its contents: it is corrupt")
    if count != blocks:
        raise ValueError(f"it lists {count} blocks, the metadata {blocks}")
    lengths = np.frombuffer(data, "<i8", count, head).astype(np.int64)
    if (lengths < _MIN_FRAME).any():
        raise ValueError(f"it lists a frame of {int(lengths.min())} bytes, less than a TFRecord frame's {_MIN_FRAME}")
    if int(lengths.sum()) != shard_bytes:
        raise ValueError(f"its blocks' frames add up to {int(lengths.sum())} bytes, the metadata lists {shard_bytes}")
    return lengths


def check_split_name(name: str) -> str:
    if not _SPLIT_NAME.match(name):
        raise ValueError(f"split name {name!r} is invalid: use a letter followed by letters, digits or '_'")
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
            raise ValueError(f"feature {self.name!r}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        shape = tuple(self.shape)
        if len(shape) > 1 or (shape and shape[0] is not None and int(shape[0]) < 0):
            raise ValueError(f"feature {self.name!r}: shape must be (), (k,) or (None,), got {self.shape!r}")
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
        if self.dtype in FLOAT_DTYPES:
            d["default"] = json_number(self.default)  # strict JSON: "NaN", "Infinity" (ingest.statistics)
        return d

    @classmethod
    def from_json(cls, d: Mapping, where: str = "feature") -> "FeatureSpec":
        d = dict(_object(d, where))
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; known keys: {known}")
        name = _typed(d, "name", str, where)
        where = f"{where} ({name!r})"
        _typed(d, "dtype", str, where)
        shape = _typed(d, "shape", list, where, default=[])
        if len(shape) > 1 or any(k is not None and (not _is_int(k) or k < 0) for k in shape):
            raise ValueError(f"{where}.shape must be [], [k] with k >= 0, or [null], got {shape!r}")
        d["shape"] = tuple(shape)
        for key in ("missing", "min_length", "max_length"):
            value = d.get(key)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{where}.{key} must be a non-negative integer, got {value!r}")
        _typed(d, "role", (str, type(None)), where, default=None)
        _typed(d, "text", bool, where, default=False)
        kinds = {"int64": int, "float32": (int, float), "float64": (int, float), "bytes": str}.get(d["dtype"], object)
        default = d.get("default")
        if d["dtype"] in FLOAT_DTYPES and default is not None:
            default = d["default"] = number_of(default, f"{where}.default")
        if default is not None and (isinstance(default, bool) or not isinstance(default, kinds)):
            raise ValueError(f"{where}.default {default!r} does not fit dtype {d['dtype']!r}")
        return cls(**d)


def _natural_default(dtype: str):
    return {"int64": 0, "float32": 0.0, "float64": 0.0, "bytes": ""}[dtype]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_MISSING = object()
_JSON_NAMES = {
    Mapping: "an object",
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def _found(value) -> str:
    return f"{_JSON_NAMES.get(type(value), type(value).__name__)} {value!r:.80}"


def _object(value, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {_found(value)}")
    return value


def _typed(d: Mapping, key: str, kinds, where: str, *, default=_MISSING):
    """d[key], checked against `kinds`; the error says where in the metadata and what was found."""
    if key not in d:
        if default is _MISSING:
            raise ValueError(f"{where} has no {key!r} key")
        return default
    value = d[key]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"{where}.{key} must be {' or '.join(_JSON_NAMES[k] for k in kinds)}, got {_found(value)}")
    return value


def _file_inside(d: Mapping, key: str, where: str, *, default=_MISSING):
    """d[key]: a file name inside the dataset directory (no absolute path, no way out of it)."""
    name = _typed(d, key, str if default is _MISSING else (str, type(None)), where, default=default)
    if name is None:
        return None
    if not name or name.startswith(("/", "\\")) or "://" in name or ".." in re.split(r"[/\\]", name):
        raise ValueError(f"{where}.{key} must name a file inside the dataset directory, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    filename: str
    records: int  # rows, whatever the layout
    bytes: int
    blocks: int | None = None  # TFRecords of the block layout; None for the rows layout
    # The shard's block index (`encode_block_index`), uncompressed blocks layout only; None
    # for shards converted before indexes were written: readers scan their frame headers.
    index: str | None = None
    # `shard_fingerprint` of the file as written; None for shards converted before it was recorded.
    fingerprint: str | None = None

    @property
    def tfrecords(self) -> int:
        """TFRecords in the shard file: its blocks, or (rows layout) its rows."""
        return self.records if self.blocks is None else self.blocks

    def to_json(self) -> dict:
        d = {"filename": self.filename, "records": self.records, "bytes": self.bytes}
        if self.blocks is not None:
            d["blocks"] = self.blocks
        if self.index is not None:
            d["index"] = self.index
        return d if self.fingerprint is None else {**d, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, d: Mapping, where: str = "shard") -> "ShardInfo":
        d = _object(d, where)
        filename = _file_inside(d, "filename", where)
        index = _file_inside(d, "index", where, default=None)
        if index == filename:
            raise ValueError(f"{where}.index names the shard itself ({filename!r}), not its block index")
        counts = {}
        for key in ("records", "bytes", "blocks"):
            value = (
                _typed(d, key, (int, type(None)), where, default=None)
                if key == "blocks"
                else _typed(d, key, int, where)
            )
            if value is not None and value < 0:
                raise ValueError(f"{where}.{key} must be >= 0, got {value}")
            counts[key] = value
        # A block holds at least one row: more blocks than rows is a hand edit, and readers
        # size arrays by the block count before any file is opened.
        if counts["blocks"] is not None and counts["blocks"] > counts["records"]:
            raise ValueError(
                f"{where}.blocks is {counts['blocks']}, more than its {counts['records']} records: "
                "a block holds at least one record"
            )
        if index is not None and counts["blocks"] is None:
            raise ValueError(f"{where} has an index but no blocks: only shards of the blocks layout have one")
        fingerprint = _typed(d, "fingerprint", (str, type(None)), where, default=None)
        if fingerprint is not None and not re.fullmatch(r"[0-9a-f]{64}", fingerprint):
            raise ValueError(f"{where}.fingerprint must be 64 hexadecimal digits (a SHA-256), got {fingerprint!r:.80}")
        return cls(filename, counts["records"], counts["bytes"], counts["blocks"], index, fingerprint)


def _check_shard_counts(shard: ShardInfo, split: str, block_rows: int | None, compression: str) -> None:
    """Refuses a shard whose counts contradict each other: readers size their block tables
    and windows by them before reading the shard (a crafted count of 10**12 blocks crashed
    the reading process)."""
    where = f"split {split!r}, shard {shard.filename!r}"
    if block_rows is not None and shard.blocks is not None:
        # Every block holds block_rows rows but the last of its shard (docs/block_format.md).
        expected = -(-shard.records // block_rows)
        if shard.blocks != expected:
            raise ValueError(
                f"{where}: blocks is {shard.blocks}, but its {shard.records} records in blocks of block_rows="
                f"{block_rows} make {expected}"
            )
    if compression == "none" and shard.bytes < _MIN_FRAME * shard.tfrecords:
        raise ValueError(
            f"{where}: bytes is {shard.bytes}, less than the {_MIN_FRAME * shard.tfrecords} its "
            f"{shard.tfrecords} TFRecords take at {_MIN_FRAME} bytes each at least"
        )


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

    @property
    def tfrecords(self) -> int:
        """TFRecords in the split's files: blocks, or (rows layout) rows."""
        return sum(s.tfrecords for s in self.shards)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "records": self.records,
            "bytes": self.bytes,
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, d: Mapping, where: str = "split") -> "SplitInfo":
        d = _object(d, where)
        name = _typed(d, "name", str, where)
        where = f"{where} ({name!r})"
        shards = tuple(
            ShardInfo.from_json(s, f"{where}.shards[{i}]") for i, s in enumerate(_typed(d, "shards", list, where))
        )
        split = cls(name=name, shards=shards)
        # The totals are derived from the shards; a disagreement means a hand edit.
        for key in ("records", "bytes"):
            if key in d and d[key] != getattr(split, key):
                raise ValueError(f"{where}.{key} is {d[key]!r} but its shards add up to {getattr(split, key)}")
        return split


def _laid_out(value, depth: int, indent: str) -> str:
    """`value` as JSON text: objects opened `depth` levels deep, one key a line; what lies
    deeper on one line."""
    if depth == 0 or not isinstance(value, Mapping) or not value:
        return json.dumps(value, allow_nan=False)
    inner = indent + "  "
    items = ",\n".join(f"{inner}{json.dumps(k)}: {_laid_out(v, depth - 1, inner)}" for k, v in value.items())
    return f"{{\n{items}\n{indent}}}"


def _strict(value):
    """`value` with each float JSON has no number for as its string (`statistics.json_number`)."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, Mapping):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _statistics_text(statistics: dict) -> str:
    """The "statistics" object, each feature's fields one a line, their values on that line.

    Not `json.dumps(indent=2)`: with an indent, json falls back to its pure-Python
    encoder, a fixed cost of every conversion. The benchmark corpus' metadata (21
    features, ~6,000 floats) took 9.4 ms that way and 6.9 ms this way, in 72 KB instead
    of 115; a 100-row conversion's 20 ms and 9 ms.
    """
    overall = _laid_out(statistics["overall"], 2, "    ")  # feature -> its fields
    splits = _laid_out(statistics["splits"], 3, "    ")  # split -> feature -> its fields
    return f'{{\n    "overall": {overall},\n    "splits": {splits}\n  }}'


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
    # None: the version these features need (`format_version_of`).
    format_version: int | None = None
    # Class names of an integer label: labels[i] is the name of class i (sorted at conversion).
    labels: tuple = ()
    # Image datasets: {"feature": the encoded-image feature, "stored": the storing options,
    # "formats": images per stored format, "actions": re-encoded/resized/... counts}.
    # Format "raw" (--reencode raw): image/encoded holds uint8 RGB pixels, row-major
    # [image/height, image/width, 3], which readers need to reshape them.
    # Empty for tabular data.
    image: Mapping = dataclasses.field(default_factory=dict)
    # What the conversion noticed that readers should know (e.g. a split that got no records).
    warnings: tuple = ()
    # "rows": one tf.train.Example per record; "blocks": up to `block_rows` records per
    # Example, column by column (docs/block_format.md).
    layout: str = "rows"
    block_rows: int | None = None
    # Per-feature statistics recorded at conversion (`ingest.statistics`); None when the
    # conversion ran with --no_statistics, or before they existed.
    statistics: Statistics | None = None
    # Text features' vocabularies (format 4): {feature: {"file": relative path (a JSON list of
    # the values, most frequent first), "size": values, "sha256": of the file's bytes (recorded
    # since; `parse_vocabulary` checks it)}}. Value vocabulary[i - 1] has id i; 0 is out of
    # vocabulary. Absent for a feature with more distinct values than the limit.
    vocabularies: Mapping = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.format_version is None:
            object.__setattr__(self, "format_version", format_version_of(self.features))
        wide = [f.name for f in self.features if f.dtype == "float64"]
        if wide and self.format_version < FLOAT64_SINCE:
            raise ValueError(
                f"metadata has float64 feature(s) {wide} but format_version {self.format_version}; float64 "
                f"features came with format_version {FLOAT64_SINCE}: the file was edited, reconvert the dataset"
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"feature names must be unique, got {names}")
        if self.label is not None and self.label not in names:
            raise ValueError(f"label {self.label!r} is not a feature; features: {names}")
        if self.image and self.image.get("feature") not in names:
            raise ValueError(f"image feature {self.image.get('feature')!r} is not a feature; features: {names}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if (self.layout == "blocks") != (self.block_rows is not None) or (
            self.block_rows is not None and self.block_rows < 1
        ):
            raise ValueError(
                f"block_rows must be a positive number for the blocks layout only, got {self.block_rows!r}"
            )
        # beam_jobs' MAX_BLOCK_ROWS (a test checks they agree): a reader holds a window of
        # blocks in memory, sized by block_rows before it reads one.
        if self.block_rows is not None and self.block_rows > 1 << 16:
            raise ValueError(f"block_rows must be in [1, {1 << 16}] (the conversion's limit), got {self.block_rows}")
        if self.layout == "blocks" and any(s.blocks is None for split in self.splits for s in split.shards):
            raise ValueError("every shard of the blocks layout must give its number of blocks")
        for name, v in self.vocabularies.items():
            spec = next((f for f in self.features if f.name == name), None)
            if spec is None or spec.dtype != "bytes":
                raise ValueError(f"vocabularies names {name!r}, which is not a bytes feature; features: {names}")
            if (
                not isinstance(v, Mapping)
                or not isinstance(v.get("file"), str)
                or not _is_int(v.get("size"))
                or v["size"] < 0
                or not re.fullmatch(r"[0-9a-f]{64}", v.get("sha256", "0" * 64) or "")
                or set(v) - {"file", "size", "sha256"}
            ):
                raise ValueError(
                    f"vocabularies[{name!r}] must be {{'file': path, 'size': n, 'sha256': its 64 hex digits}}, "
                    f"got {v!r:.200}"
                )
            _file_inside(v, "file", f"vocabularies[{name!r}]")
        for split in self.splits:
            for shard in split.shards:
                _check_shard_counts(shard, split.name, self.block_rows, self.compression)
        indexed = [s.filename for split in self.splits for s in split.shards if s.index is not None]
        if indexed and (self.layout != "blocks" or self.compression != "none"):
            # A gzip shard's byte offsets are not its blocks' offsets: it is read as a stream.
            raise ValueError(
                f"shard {indexed[0]!r} has a block index, which only uncompressed shards of the blocks layout "
                f"have; this dataset has layout {self.layout!r} and compression {self.compression!r}"
            )

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"no feature {name!r} in this dataset; features: {[f.name for f in self.features]}")

    def vocabulary(self, name: str) -> tuple:
        """The vocabulary of text feature `name`, most frequent value first: with
        `make_dataset(..., text="ids")` value `vocabulary[i - 1]` arrives as id `i`, and
        id 0 is a value out of it (Keras `StringLookup`'s convention)."""
        if name not in self.vocabularies:
            raise KeyError(
                f"feature {name!r} has no vocabulary; the features that have one: {sorted(self.vocabularies)}"
                + (f" (warnings: {list(self.warnings)})" if self.warnings else "")
            )
        read = self.__dict__.get("_read_vocabulary")
        if read is None:
            raise ValueError("this metadata was not read from a dataset directory: use ingest.load_info(path)")
        return read(name)

    def split(self, name: str) -> SplitInfo:
        for s in self.splits:
            if s.name == name:
                return s
        raise KeyError(f"no split {name!r} in this dataset; splits: {[s.name for s in self.splits]}")

    def to_json(self) -> str:
        text = json.dumps(
            {
                "format_version": self.format_version,
                "created": self.created,
                "compression": self.compression,
                "layout": self.layout,
                **({"block_rows": self.block_rows} if self.block_rows is not None else {}),
                "label": self.label,
                "features": [f.to_json() for f in self.features],
                "splits": [s.to_json() for s in self.splits],
                # Strict JSON (RFC 8259), which JavaScript's and Go's parsers read: no bare Infinity or NaN.
                "source": _strict(self.source),
                "options": _strict(self.options),
                "quarantine": _strict(self.quarantine),
                **({"labels": list(self.labels)} if self.labels else {}),
                **({"image": _strict(self.image)} if self.image else {}),
                **({"warnings": list(self.warnings)} if self.warnings else {}),
                **({"vocabularies": {k: dict(v) for k, v in self.vocabularies.items()}} if self.vocabularies else {}),
            },
            indent=2,
            sort_keys=False,
            allow_nan=False,
        )
        if self.statistics is None:
            return text
        return f'{text[:-2]},\n  "statistics": {_statistics_text(self.statistics.to_json())}\n}}'

    @classmethod
    def from_json(cls, text: str) -> "DatasetInfo":
        """Parses and checks metadata; a ValueError says what is wrong and where in the file."""
        if not text.strip():
            raise ValueError("it is empty")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            cut = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string")
            raise ValueError(f"it is not valid JSON{' (cut short?)' if cut else ''}: {e}") from e
        d = _object(d, "the metadata")
        version = _typed(d, "format_version", int, "metadata")
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"dataset metadata has format_version {version!r}; this version of ingest "
                f"reads format_version {', '.join(map(str, READABLE_VERSIONS[:-1]))} and {READABLE_VERSIONS[-1]}: "
                "reconvert the dataset or upgrade ingest"
            )
        features = _typed(d, "features", list, "metadata")
        splits = _typed(d, "splits", list, "metadata")
        names = [
            _typed(s, "name", str, f"metadata.splits[{i}]") if isinstance(s, Mapping) else None
            for i, s in enumerate(splits)
        ]
        twice = sorted({n for n in names if n is not None and names.count(n) > 1})
        if twice:
            raise ValueError(f"metadata.splits lists split(s) {twice} more than once")
        labels = _typed(d, "labels", list, "metadata", default=[])
        warnings = _typed(d, "warnings", list, "metadata", default=[])
        if not all(isinstance(x, str) for x in labels):
            raise ValueError(f"metadata.labels must be a list of strings, got {labels!r:.200}")
        # Class i is labels[i]: a name listed twice has two ids, and the lookup table fails.
        twice = sorted({x for x, n in collections.Counter(labels).items() if n > 1})
        if twice:
            raise ValueError(
                f"metadata.labels lists class(es) {twice!r:.200} more than once (at positions "
                f"{[i for i, x in enumerate(labels) if x == twice[0]]} for {twice[0]!r}): each class name must be "
                "listed once"
            )
        return cls(
            features=tuple(FeatureSpec.from_json(f, f"metadata.features[{i}]") for i, f in enumerate(features)),
            splits=tuple(SplitInfo.from_json(s, f"metadata.splits[{i}]") for i, s in enumerate(splits)),
            compression=_typed(d, "compression", str, "metadata", default="none"),
            label=_typed(d, "label", (str, type(None)), "metadata", default=None),
            source=_typed(d, "source", Mapping, "metadata", default={}),
            options=_typed(d, "options", Mapping, "metadata", default={}),
            quarantine=_typed(d, "quarantine", Mapping, "metadata", default={}),
            created=_typed(d, "created", str, "metadata", default=""),
            format_version=version,
            labels=tuple(labels),
            image=_typed(d, "image", Mapping, "metadata", default={}),
            warnings=tuple(warnings),
            layout=_typed(d, "layout", str, "metadata", default="rows"),
            block_rows=_typed(d, "block_rows", (int, type(None)), "metadata", default=None),
            statistics=Statistics.from_json(d["statistics"]) if d.get("statistics") is not None else None,
            vocabularies=_typed(d, "vocabularies", Mapping, "metadata", default={}),
        )
