"""Conversion jobs: CSV, Parquet and image corpora -> sharded TFRecords (`python -m beam_jobs.convert`)."""

from beam_jobs.encode.examples import encode_record_batch
from beam_jobs.write import WriteDataset

__all__ = ["encode_record_batch", "WriteDataset"]
