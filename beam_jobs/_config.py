"""The job's configuration, fixed at launch and shipped to every worker."""

from __future__ import annotations

import dataclasses

from beam_jobs import _sources, _typing
from beam_jobs._images import ImageOptions
from ingest import contract

__all__ = ["JobConfig", "decided_types"]


@dataclasses.dataclass(frozen=True)
class JobConfig:
    source_format: str  # "csv" | "parquet" | "images"
    input_pattern: str
    files: tuple
    output: str
    tmp_dir: str
    columns: tuple
    header: tuple = ()
    csv: _sources.CsvFormat = _sources.CsvFormat()
    given_types: tuple = ()  # ((name, dtype), ...)
    arrow_types: tuple = ()  # parquet: ((name, dtype, shape), ...)
    label: str | None = None
    splits: tuple = (("train", 1.0),)
    split_key: str | None = None
    num_shards: tuple = (1,)  # per split
    shuffle: bool = True
    seed: int = 0
    compression: str = "none"
    max_bad_fraction: float = 0.001
    overwrite: bool = False
    binary_columns: tuple = ()  # bytes columns that hold binary data, not UTF-8 text
    input_bytes: int = 0
    schema_origin: str = "inferred"  # "inferred" | "given" | "mixed" | "parquet" | "images"
    input_count: int = 0  # input files, or images for an image corpus
    file_sizes: tuple = ()  # bytes of each of `files`
    csv_split_bytes: int = 0  # read CSV files larger than this as byte ranges (0: whole files)
    images: ImageOptions | None = None
    vocabulary: tuple = ()  # label names of an image corpus; the label index is the position
    extra_types: tuple = ()  # image manifest extras: ((name, pyarrow type), ...)
    # Image work items go to the pipeline as elements, never to workers with the config.
    image_items: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def for_workers(self) -> "JobConfig":
        return dataclasses.replace(self, image_items=())

    def recorded_options(self) -> dict:
        """The options that shaped the output, as recorded in the metadata."""
        return {
            "columns": list(self.columns),
            "label": self.label,
            "splits": dict(self.splits),
            "split_key": self.split_key,
            "num_shards": dict(zip(self.split_names, self.num_shards)),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "compression": self.compression,
            "max_bad_fraction": self.max_bad_fraction,
            "delimiter": self.csv.delimiter if self.source_format == "csv" else None,
            "null_values": list(self.csv.null_values) if self.source_format == "csv" else None,
            "allow_quoted_newlines": self.csv.allow_quoted_newlines if self.source_format == "csv" else None,
            "given_types": dict(self.given_types),
            **({"image": self.images.recorded()} if self.images is not None else {}),
        }

    @property
    def infer(self) -> bool:
        return self.source_format == "csv" and any(c not in dict(self.given_types) for c in self.columns)

    @property
    def job_id(self) -> str:
        return self.tmp_dir.rsplit("/", 1)[-1].removeprefix(contract.TEMP_PREFIX)

    @property
    def split_names(self) -> list:
        return [s for s, _ in self.splits]


def decided_types(cfg: JobConfig, type_counts) -> dict:
    """(dtype, shape) per selected column, from given types, inference, or Arrow."""
    if cfg.source_format != "csv":
        return {name: (dtype, tuple(shape)) for name, dtype, shape in cfg.arrow_types}
    counts = {k: _typing.TypeCounts(**v) for k, v in (type_counts or {}).items()}
    types = _typing.decide_types(counts, cfg.columns, tolerance=cfg.max_bad_fraction, given=dict(cfg.given_types))
    return {name: (types[name], ()) for name in cfg.columns}
