"""Pure sizing decisions for the runtime input pipeline (`make_dataset`): no TensorFlow, no I/O.

(`beam_jobs._plan` plans the conversion; this module tunes the reading.)
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "is_remote",
    "cycle_length",
    "read_buffer_bytes",
    "interleave_parallelism",
    "shuffle_buffer",
    "should_cache_in_memory",
    "cache_budget",
    "cache_target",
    "parse_block",
    "batches",
    "FileShards",
    "shard_files",
]

_REMOTE_PREFIXES = ("gs://", "s3://", "hdfs://", "http://", "https://")
# Conversion already shuffles records across shards, so the runtime buffer only needs to
# vary the order between epochs; a larger one stalls each epoch's start while it fills.
SHUFFLE_TARGET_BYTES = 16 << 20
LOCAL_READ_BUFFER = 1 << 20
REMOTE_READ_BUFFER = 8 << 20
REMOTE_CYCLE = 16


def is_remote(path: str) -> bool:
    return path.startswith(_REMOTE_PREFIXES)


def cycle_length(num_files: int, *, remote: bool, cpu_count: int, requested: int | None = None) -> int:
    if requested is not None:
        return max(1, min(requested, num_files))
    width = REMOTE_CYCLE if remote else 2 * max(1, cpu_count)
    return max(1, min(num_files, width))


def interleave_parallelism(cycle: int, *, remote: bool, requested: int | None = None) -> int | None:
    """Parallel calls of the shard interleave; None means tf.data AUTOTUNE.

    Reads that wait on latency need threads, not cores: behind 20 ms reads (the suite's
    slow-storage scenario) 16 shards on AUTOTUNE's core-sized pool left the device 58%
    idle, one call per shard 0.8%. Local disks keep AUTOTUNE.
    """
    if requested is not None:
        return min(requested, cycle)  # tf.data refuses more calls than the cycle holds
    return cycle if remote else None


def read_buffer_bytes(*, remote: bool, requested: int | None = None) -> int:
    if requested is not None:
        return requested
    return REMOTE_READ_BUFFER if remote else LOCAL_READ_BUFFER


def shuffle_buffer(records: int, avg_record_bytes: float, *, batch_size: int, requested: int | None = None) -> int:
    if requested is not None:
        return requested
    by_memory = int(SHUFFLE_TARGET_BYTES / max(avg_record_bytes, 1.0))
    return max(1, min(records, max(by_memory, 4 * batch_size)))


PARSE_BLOCK = 1024


def parse_block(batch_size: int, requested: int | None = None) -> int:
    return max(batch_size, requested or PARSE_BLOCK)


def batches(records: int, batch_size: int, *, drop_remainder: bool) -> int:
    return records // batch_size if drop_remainder else -(-records // batch_size)


def should_cache_in_memory(split_bytes: int, budget_bytes: int) -> bool:
    # Cached tensors cost more than their serialized bytes; keep a 2x margin.
    return 2 * split_bytes <= budget_bytes


# The cache shares the machine with the model, the trainer and tf.data's own buffers
# (whose autotune budget is half of RAM): a quarter is what is left to spare.
CACHE_MEMORY_FRACTION = 4


def cache_budget(memory_bytes: int, requested: int | None = None) -> int:
    """Bytes `cache="auto"` may fill in memory: `requested`, or a quarter of `memory_bytes`."""
    return requested or memory_bytes // CACHE_MEMORY_FRACTION


def cache_target(cache: str | None, *, records_bytes: int, budget_bytes: int) -> str | None:
    """Where the read records are cached: None (not at all), "memory" or a file path.

    `cache` is make_dataset's argument; "auto" becomes "memory" when `records_bytes` (what
    this input pipeline reads) fits `budget_bytes`, None otherwise.
    """
    if cache == "auto":
        return "memory" if should_cache_in_memory(records_bytes, budget_bytes) else None
    return cache


@dataclasses.dataclass(frozen=True)
class FileShards:
    """The files one input pipeline reads, and how it shards records if it must."""

    files: tuple
    counts: tuple  # records in each of `files`
    records: int  # records this pipeline will see
    record_shard: tuple | None = None  # (num_shards, index) for record-level sharding


def shard_files(files, records, *, num_pipelines: int, pipeline_id: int) -> FileShards:
    """File-level sharding across input pipelines, record-level when files are too few."""
    files, records = tuple(files), tuple(records)
    if num_pipelines <= 1:
        return FileShards(files, records, sum(records))
    if not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"input pipeline id {pipeline_id} is out of range for {num_pipelines} pipelines")
    if len(files) >= num_pipelines:
        mine = range(pipeline_id, len(files), num_pipelines)
        counts = tuple(records[i] for i in mine)
        return FileShards(tuple(files[i] for i in mine), counts, sum(counts))
    total = sum(records)
    count = math.ceil((total - pipeline_id) / num_pipelines) if total > pipeline_id else 0
    return FileShards(files, records, count, (num_pipelines, pipeline_id))
