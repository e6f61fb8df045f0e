"""The job's configuration, fixed at launch and shipped to every worker."""

from __future__ import annotations

import dataclasses

from beam_jobs.adapters import Source
from ingest import contract

__all__ = ["JobConfig"]


@dataclasses.dataclass(frozen=True)
class JobConfig:
    source: Source  # what differs by input format: its adapter, as opened at launch
    output: str
    tmp_dir: str = ""
    label: str | None = None
    splits: tuple = (("train", 1.0),)
    split_key: str | None = None
    num_shards: tuple = (1,)  # per split
    shuffle: bool = True
    seed: int = 0
    compression: str = "none"
    max_bad_fraction: float = 0.001
    overwrite: bool = False

    @property
    def columns(self) -> tuple:
        return self.source.columns

    @property
    def source_format(self) -> str:
        return self.source.format

    def for_workers(self) -> "JobConfig":
        return dataclasses.replace(self, source=self.source.for_workers())

    def types(self, type_counts) -> dict:
        """(dtype, shape) per column, from given types, inference, or the source's schema."""
        return self.source.decided_types(type_counts, tolerance=self.max_bad_fraction)

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
            **self.source.recorded(),
        }

    @property
    def job_id(self) -> str:
        return self.tmp_dir.rsplit("/", 1)[-1].removeprefix(contract.TEMP_PREFIX)

    @property
    def split_names(self) -> list:
        return [s for s, _ in self.splits]
