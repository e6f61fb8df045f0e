"""The job's options, declared once: a frozen, self-checking object built before any file is read, and the
CLI's flags, WriteDataset's keywords and the recorded options made from its declaration."""

from __future__ import annotations

import dataclasses
import os
import uuid

from beam_jobs._errors import ConversionError
from beam_jobs.output import directory as output_dir
from beam_jobs.output import shard_plan

__all__ = ["JobOptions", "RECORDED", "DEFAULT_BLOCK_ROWS", "MAX_BLOCK_ROWS", "new_job_id"]

# Rows per block of the blocks layout (docs/block_format.md). Measured (benchmarks.block_rows,
# 500k rows): at the runtime's 65k-row windows, throughput is flat from 256 to 4096 rows
# (814k-876k rows/s, within run-to-run noise) and so are the bytes; mixing coarsens with
# K (batch-mates meeting again: 0.053% at 256, 0.056% at 1024, 0.068% at 4096; ideal
# 0.051%). 1024 keeps mixing within 10% of ideal with few, large records for other
# readers. The window, not K, sets the parse granularity, so K does not follow row width.
DEFAULT_BLOCK_ROWS = 1024
# The runtime parses blocks in windows of >= 65,536 rows (ingest.pipeline._tuning.WINDOW_ROWS) and
# holds a window's rows in memory: a larger block would make each window its size (a
# billion-row block: 7.8 GB and no batch), so a block holds at most one window's rows.
MAX_BLOCK_ROWS = 1 << 16


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


def _columns(text) -> tuple:
    """'a,b,c' (the CLI) or a list (WriteDataset) -> ('a', 'b', 'c')."""
    names = [c.strip() for c in text.split(",")] if isinstance(text, str) else list(text)
    return tuple(c for c in names if c)


def _splits(value) -> tuple:
    """'train=0.9,eval=0.1' (the CLI) or {'train': 0.9, ...} (WriteDataset) -> ((name, fraction), ...)."""
    if isinstance(value, dict):
        value = ",".join(f"{name}={fraction}" for name, fraction in value.items())
    try:
        return tuple(shard_plan.parse_splits(value).items())
    except ValueError as e:
        raise ConversionError(str(e)) from e


def _dataset_path(value) -> str:
    """A dataset directory (text or os.PathLike), without a trailing '/'."""
    return os.fspath(value).rstrip("/")


def _option(default=dataclasses.MISSING, *, help: str, type=str, cli="value", **more):
    """The declaration of one job option: the field gives its name and default; `type`,
    `choices` and `help` make its flag; `cli` says how the flag takes it ("value",
    "switch": --name, "negatable": --name / --no_name with `off_help`, "text": a value
    `parse` turns into the field's); `recorded=False` keeps it out of dataset_info.json;
    `keyword=False` keeps it from WriteDataset's keywords."""
    metadata = dict(help=help, type=type, cli=cli, choices=None, recorded=True, keyword=True, parse=None)
    metadata.update(more)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """The job's options, declared once: `python -m beam_jobs.convert`'s flags
    (`add_flags`), `WriteDataset`'s keywords (`keywords`) and the options recorded in
    dataset_info.json (`RECORDED`) are made from these fields, and checked here."""

    source: str = _option(help="input format", cli="required", keyword=False, recorded=False)
    input: str = _option(
        help="file pattern, local or gs:// (e.g. 'data/*.csv', 'gs://b/x-*.parquet'); "
        "for images: a folder ROOT/<label>/<file>, or a manifest .csv/.parquet",
        cli="required",
        keyword=False,
        recorded=False,
    )
    output: str = _option(help="dataset directory, local or gs://", cli="required", keyword=False, recorded=False)
    columns: tuple | None = _option(
        None, help="comma-separated columns to keep, in this order (default: all)", cli="text", parse=_columns
    )
    label: str | None = _option(None, help="the label column (image manifests: default 'label')")
    splits: tuple | None = _option(
        None,
        help="NAME=FRACTION,... (default: everything in 'train'; with --schema_from, that dataset's splits)",
        cli="text",
        parse=_splits,
    )
    split_key: str | None = _option(
        None,
        help="column whose value decides the split, so that a key's records share one (default: the record "
        "content; with --schema_from, that dataset's --split_key; '' for the record content)",
    )
    num_shards: int | None = _option(None, type=int, help="shards per split (default: planned from the input size)")
    target_shard_mb: float = _option(
        shard_plan.DEFAULT_TARGET_SHARD_MB, type=float, help="target shard size when planning", recorded=False
    )
    shuffle: bool = _option(
        True,
        cli="negatable",
        help="shuffle records across shards (default)",
        off_help="keep source order within each shard",
    )
    seed: int = _option(0, type=int, help="seed of the record shuffle")
    compression: str = _option("none", choices=("none", "gzip"), help="write .tfrecord.gz with gzip")
    max_bad_fraction: float = _option(0.001, type=float, help="fail when more rows than this are quarantined")
    overwrite: bool = _option(
        False,
        cli="switch",
        help="replace a dataset already in --output (the old one stays readable until the new metadata is written)",
        recorded=False,
    )
    stale_job_hours: float = _option(
        output_dir.DEFAULT_STALE_HOURS,
        type=float,
        help="a temp dir of a job started on another machine counts as abandoned after this many hours",
        recorded=False,
    )
    layout: str | None = _option(
        None,
        choices=("rows", "blocks"),
        help="records as up to --block_rows rows per tf.train.Example, column by column (blocks; "
        "docs/block_format.md), or one Example per row (rows: for TFX, TFDV and other tf.Example readers); "
        "default: blocks (images: rows)",
    )
    block_rows: int | None = _option(
        None,
        type=int,
        help=f"rows per block of the blocks layout (default {DEFAULT_BLOCK_ROWS}, at most {MAX_BLOCK_ROWS})",
    )
    schema_from: str | None = _option(
        None,
        help="DATASET: take the features (names, types, shapes, defaults) and the label with its classes from "
        "this converted dataset's metadata (local or gs://) instead of inferring them, so that spans converted "
        "day by day agree; a value that does not fit is quarantined, a missing or extra column is an error",
        parse=_dataset_path,
    )
    statistics: bool = _option(
        True,
        cli="negatable",
        help="record per-feature statistics in the metadata, in the same pass (default; `ingest describe`)",
        off_help="skip the statistics (~5%% faster conversion)",
    )

    def __post_init__(self):
        twice = sorted({c for c in self.columns or () if self.columns.count(c) > 1})
        if twice:
            raise ConversionError(f"--columns names {twice} more than once; name each column once")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConversionError(f"--seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not 0 <= self.max_bad_fraction <= 1:
            raise ConversionError(f"--max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        if self.num_shards is not None and self.num_shards < 1:
            raise ConversionError(f"--num_shards must be at least 1, got {self.num_shards}")
        if not self.target_shard_mb > 0:
            raise ConversionError(f"--target_shard_mb must be positive, got {self.target_shard_mb}")
        if not self.stale_job_hours > 0:
            raise ConversionError(f"--stale_job_hours must be positive, got {self.stale_job_hours}")
        if self.layout not in (None, "rows", "blocks"):
            raise ConversionError(f"--layout must be rows or blocks, got {self.layout!r}")
        if self.block_rows is not None and not 1 <= self.block_rows <= MAX_BLOCK_ROWS:
            raise ConversionError(
                f"--block_rows must be in [1, {MAX_BLOCK_ROWS}] (a block is parsed within one window of the "
                f"runtime's, held in memory), got {self.block_rows}"
            )
        if self.schema_from is not None and (not isinstance(self.schema_from, str) or not self.schema_from.strip("/")):
            raise ConversionError(f"--schema_from must name a converted dataset's directory, got {self.schema_from!r}")
        if self.schema_from is not None and not self.schema_from:
            raise ConversionError("--schema_from must name a converted dataset's directory, got ''")
        if self.compression not in ("none", "gzip"):
            raise ConversionError(f"--compression must be none or gzip, got {self.compression!r}")

    def claim_output(self, *, running_here: bool = True, job_id: str | None = None) -> str:
        """Claims --output for a new job (`output_dir.claim_output`); returns its temp dir."""
        return output_dir.claim_output(
            self.output,
            overwrite=self.overwrite,
            job_id=job_id or new_job_id(),
            stale_after_s=self.stale_job_hours * 3600,
            running_here=running_here,
        )

    @classmethod
    def from_args(cls, args) -> "JobOptions":
        """From the flags `add_flags` declared (a text flag not given takes the field's default)."""
        values = {}
        for f in dataclasses.fields(cls):
            value = getattr(args, f.name)
            if f.metadata["parse"] is not None:
                value = f.default if value is None else f.metadata["parse"](value)
            values[f.name] = value
        return cls(**{**values, "output": values["output"].rstrip("/")})

    @classmethod
    def of_keywords(cls, output, **keywords) -> "JobOptions":
        """From WriteDataset's keywords: those `keywords()` lists, each as its field takes it."""
        unknown = sorted(set(keywords) - set(cls.keywords()))
        if unknown:
            raise TypeError(f"WriteDataset got unknown keyword(s) {unknown}; it takes {list(cls.keywords())}")
        for name, value in keywords.items():
            parse = cls.declared(name).metadata["parse"]
            if parse is not None and value is not None:
                keywords[name] = parse(value)
        return cls(source="rows", input="<PCollection>", output=str(output).rstrip("/"), **keywords)

    @classmethod
    def declared(cls, name: str) -> dataclasses.Field:
        return next(f for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def keywords(cls) -> dict:
        """{name: default} of the options WriteDataset takes as keywords."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.metadata["keyword"]}

    @classmethod
    def add_flags(cls, parser, flag, *, choices: dict) -> None:
        """The CLI's flags, one per option (`choices`: those known only at the top, e.g. --source)."""
        for f in dataclasses.fields(cls):
            md, kind = f.metadata, f.metadata["cli"]
            if kind == "switch":
                parser.add_argument("--" + f.name, action="store_true", help=md["help"])
            elif kind == "negatable":
                parser.add_argument("--" + f.name, dest=f.name, action="store_true", default=f.default, help=md["help"])
                negations = ("--no_" + f.name, "--no-" + f.name.replace("_", "-"), "--no" + f.name.replace("_", ""))
                parser.add_argument(*negations, dest=f.name, action="store_false", help=md["off_help"])
            else:
                default = None if kind in ("text", "required") else f.default
                flag(
                    parser,
                    f.name,
                    type=md["type"],
                    default=default,
                    required=kind == "required",
                    choices=choices.get(f.name, md["choices"]),
                    help=md["help"],
                )


# The options dataset_info.json records, in the order it lists them (with the source's own).
RECORDED = tuple(f.name for f in dataclasses.fields(JobOptions) if f.metadata["recorded"])
