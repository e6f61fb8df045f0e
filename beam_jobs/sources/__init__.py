"""Where input is read and typed: one source adapter per input format, found by its `--source` name.

To add a format (say JSON Lines): write `beam_jobs/sources/jsonl.py` with a frozen
`Source` subclass (its flags, `open` at launch, `read` and `type_chunk` on workers, what
it records in the metadata), and add one line below.
"""

from __future__ import annotations

from beam_jobs.sources.base import Source
from beam_jobs.sources.csv import CsvSource
from beam_jobs.sources.images import ImageSource
from beam_jobs.sources.parquet import ParquetSource

__all__ = ["ADAPTER_FOR_FORMAT", "Source"]

ADAPTER_FOR_FORMAT: dict = {
    "csv": CsvSource,
    "parquet": ParquetSource,
    "images": ImageSource,
}
