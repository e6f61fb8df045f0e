"""The job's configuration, fixed at launch and shipped to every worker."""

from __future__ import annotations

import dataclasses
import logging

from beam_jobs._errors import ConversionError
from beam_jobs._job_options import DEFAULT_BLOCK_ROWS, RECORDED, JobOptions
from beam_jobs.output import shard_plan
from beam_jobs.sources import Source
from ingest import contract
from ingest.names import did_you_mean

logger = logging.getLogger(__name__)

__all__ = ["JobConfig", "Decided", "layout_for"]


@dataclasses.dataclass(frozen=True)
class Decided:
    """What the job settles once the data has been seen (a first pass, where there is one)."""

    types: dict  # column -> (dtype, shape), in feature order
    binary: frozenset  # bytes columns holding binary data, not UTF-8 text
    num_shards: tuple  # per split


@dataclasses.dataclass(frozen=True)
class JobConfig:
    source: Source  # what differs by input format: its adapter, as opened at launch
    output: str
    tmp_dir: str = ""
    label: str | None = None
    splits: tuple = (("train", 1.0),)
    split_key: str | None = None
    num_shards: tuple | None = (1,)  # per split; None: planned from the first pass
    target_shard_mb: float = shard_plan.DEFAULT_TARGET_SHARD_MB
    shuffle: bool = True
    seed: int = 0
    compression: str = "none"
    max_bad_fraction: float = 0.001
    overwrite: bool = False
    layout: str = "rows"  # "rows" | "blocks" (docs/block_format.md)
    block_rows: int | None = None  # rows per block, for the blocks layout
    statistics: bool = True  # per-feature statistics in the metadata (stats.features)
    schema_from: str | None = None  # the dataset whose schema the source carries (`source.schema`)

    @classmethod
    def of(cls, opts: JobOptions, source: Source, *, tmp_dir: str, label: str | None) -> "JobConfig":
        """The configuration of a job with these checked options, reading `source`."""
        layout = layout_for(opts, type(source))
        shared = {f.name: getattr(opts, f.name) for f in dataclasses.fields(cls) if hasattr(opts, f.name)}
        splits = _splits_of(opts, source.schema)
        decided = {
            "split_key": _split_key_of(opts, source.schema),
            "source": source,
            "tmp_dir": tmp_dir,
            "label": label,
            "layout": layout,
            "splits": splits,
            "num_shards": tuple(opts.num_shards for _ in splits) if opts.num_shards else None,
            "block_rows": (opts.block_rows or DEFAULT_BLOCK_ROWS) if layout == "blocks" else None,
        }
        _warn_if_stored_otherwise(source.schema, (layout, decided["block_rows"], opts.compression))
        return cls(**{**shared, **decided})

    @property
    def columns(self) -> tuple:
        return self.source.columns

    @property
    def source_format(self) -> str:
        return self.source.format

    def for_workers(self) -> "JobConfig":
        return dataclasses.replace(self, source=self.source.for_workers())

    def decide(self, type_counts) -> Decided:
        """Column types (given, inferred, the source's schema, or one carried) and shard counts."""
        schema = self.source.schema
        if schema is None:
            types = self.source.decided_types(type_counts, tolerance=self.max_bad_fraction)
            binary = self.source.binary_of(type_counts)
        else:
            self.source.check_carried_columns(type_counts)
            types, binary = schema.types, schema.binary
        for what, column in (("label", self.label), ("split_key", self.split_key)):
            if column is not None and column not in types:
                raise ConversionError(
                    f"the {what} column {column!r}{did_you_mean(column, types)} is not among the columns: {list(types)}"
                )
        return Decided(types, frozenset(binary), self.shard_counts(type_counts))

    def shard_counts(self, type_counts) -> tuple:
        """Shards per split: as given, or planned from the output's expected size."""
        return self.num_shards or tuple(
            shard_plan.plan_num_shards(
                int(self.source.planned_bytes(type_counts) * f), target_shard_mb=self.target_shard_mb
            )
            for _, f in self.splits
        )

    def recorded_options(self, decided: Decided) -> dict:
        """The options that shaped the output, as recorded in the metadata (`RECORDED`, as decided)."""
        decided_values = {
            "columns": list(decided.types),
            "splits": dict(self.splits),
            "num_shards": dict(zip(self.split_names, decided.num_shards)),
        }
        return {**{name: decided_values.get(name, getattr(self, name)) for name in RECORDED}, **self.source.recorded()}

    @property
    def defaults(self) -> dict | None:
        """{feature: default} for missing values the writer fills in: a carried schema's
        (None: the dtype's natural default)."""
        return self.source.schema.defaults if self.source.schema is not None else None

    @property
    def job_id(self) -> str:
        return self.tmp_dir.rsplit("/", 1)[-1].removeprefix(contract.TEMP_PREFIX)

    @property
    def split_names(self) -> list:
        return [s for s, _ in self.splits]


def layout_for(opts: JobOptions, source: type) -> str:
    """The record layout: as asked, else the source's default; refused if the source has no such layout."""
    layout = opts.layout or source.layouts[0]
    if layout not in source.layouts:
        raise ConversionError(
            f"--layout {layout} does not apply to --source {source.format}: it is written as {source.layouts[0]}"
        )
    if opts.block_rows is not None and layout != "blocks":
        raise ConversionError(
            f"--block_rows applies to --layout blocks, but this job writes --layout {layout} (one "
            "tf.train.Example per row): drop --block_rows, or pass --layout blocks"
        )
    return layout


def _splits_of(opts: JobOptions, schema) -> tuple:
    """The splits as given; else a carried schema's dataset's (a span converted without
    --splits would otherwise be train-only, and fail only when its eval split is read);
    else everything in 'train'."""
    if opts.splits is not None:
        return opts.splits
    if schema is not None and schema.splits:
        logger.info(
            "--splits %s, as --schema_from %s was split (pass --splits to split otherwise)",
            ",".join(f"{name}={fraction:g}" for name, fraction in schema.splits),
            schema.dataset,
        )
        return schema.splits
    return (("train", 1.0),)


def _split_key_of(opts: JobOptions, schema) -> str | None:
    """The --split_key as given ('': the record content); else a carried schema's dataset's
    (a span split by the record would put a key's records, a user's, in every split of
    the spans read together); else None: the record content."""
    if opts.split_key is not None:
        return opts.split_key or None
    if schema is not None and schema.split_key is not None:
        logger.info(
            "--split_key %s, as --schema_from %s was split (pass --split_key '' to split by the record)",
            schema.split_key,
            schema.dataset,
        )
        return schema.split_key
    return None


def _warn_if_stored_otherwise(schema, storage: tuple) -> None:
    """Warns when a span carrying a schema is laid out otherwise than the schema's dataset:
    the runtime refuses to read such spans as one (a layout chosen on purpose is kept)."""
    if schema is None or not schema.storage or tuple(schema.storage) == tuple(storage):
        return
    flags = ("--layout", "--block_rows", "--compression")
    theirs = " ".join(f"{f} {v}" for f, v in zip(flags, schema.storage) if v is not None)
    mine = " ".join(f"{f} {v}" for f, v in zip(flags, storage) if v is not None)
    logger.warning(
        "--schema_from %s was written with %s, this span with %s: make_dataset will not read them as one "
        "dataset. Give every span the same options.",
        schema.dataset,
        theirs,
        mine,
    )
