"""The job's shared flags as one frozen, self-checking object, built before any file is read."""

from __future__ import annotations

import dataclasses
import uuid

from beam_jobs._errors import ConversionError
from beam_jobs.output import directory as output_dir
from beam_jobs.output import shard_plan

__all__ = ["JobOptions", "DEFAULT_BLOCK_ROWS", "MAX_BLOCK_ROWS", "new_job_id"]

# Rows per block of the blocks layout (docs/block_format.md). Measured (benchmarks.block_rows,
# 500k rows): at the runtime's 65k-row windows, throughput is flat from 256 to 4096 rows
# (814k-876k rows/s, within run-to-run noise) and so are the bytes; mixing coarsens with
# K (batch-mates meeting again: 0.053% at 256, 0.056% at 1024, 0.068% at 4096; ideal
# 0.051%). 1024 keeps mixing within 10% of ideal with few, large records for other
# readers. The window, not K, sets the parse granularity, so K does not follow row width.
DEFAULT_BLOCK_ROWS = 1024
# The runtime parses blocks in windows of >= 65,536 rows (ingest._tuning.WINDOW_ROWS) and
# holds a window's rows in memory: a larger block would make each window its size (a
# billion-row block: 7.8 GB and no batch), so a block holds at most one window's rows.
MAX_BLOCK_ROWS = 1 << 16


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclasses.dataclass(frozen=True)
class JobOptions:
    source: str
    input: str
    output: str
    splits: tuple = (("train", 1.0),)  # ((name, fraction), ...)
    split_key: str | None = None
    num_shards: int | None = None  # per split; None: planned from the input size
    target_shard_mb: float = shard_plan.DEFAULT_TARGET_SHARD_MB
    compression: str = "none"
    max_bad_fraction: float = 0.001
    seed: int = 0
    shuffle: bool = True
    overwrite: bool = False
    stale_job_hours: float = output_dir.DEFAULT_STALE_HOURS
    layout: str | None = None  # "rows" | "blocks"; None: the source's default
    block_rows: int | None = None  # rows per block of the blocks layout; None: DEFAULT_BLOCK_ROWS
    statistics: bool = True  # per-feature statistics in the metadata; ~5% of the conversion's time

    def __post_init__(self):
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
        try:
            splits = tuple(shard_plan.parse_splits(args.splits).items())
        except ValueError as e:
            raise ConversionError(str(e)) from e
        return cls(
            source=args.source,
            input=args.input,
            output=args.output.rstrip("/"),
            splits=splits,
            split_key=args.split_key,
            num_shards=args.num_shards,
            target_shard_mb=args.target_shard_mb,
            compression=args.compression,
            max_bad_fraction=args.max_bad_fraction,
            seed=args.seed,
            shuffle=args.shuffle,
            overwrite=args.overwrite,
            stale_job_hours=args.stale_job_hours,
            layout=args.layout,
            block_rows=args.block_rows,
            statistics=args.statistics,
        )
