"""Pure sizing decisions for the runtime input pipeline (`make_dataset`): no TensorFlow, no I/O.

(`beam_jobs.output.shard_plan` plans the conversion; this module tunes the reading.)
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
    "block_window",
    "block_run",
    "block_shuffle_buffer",
    "batches",
    "FileShards",
    "dealt_files",
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


# Rows a window of blocks holds at least (or the whole split, when smaller): the issue's
# prototype read 64 blocks of 1024 rows per parse (a ~65k-row window) at 8x the hand-tuned
# row pipeline, and a 16k-row window at 5.2x; the rows are permuted within the window, so it
# is also the finest mixing level, here a little above the rows layout's ~50k-record buffer.
WINDOW_ROWS = 1 << 16
# The seekable order reads a shard's consecutive blocks in runs, one reader per run: a
# reader costs ~120 us beyond its bytes (a tf.data function call, a file open), more than
# reading a 1024-row block (~75 us). Run-mates share a window every epoch, as rows of one
# larger block would, so runs coarsen mixing; a wider window wins it back. Measured on the
# 500k-row benchmark corpus, long-lived iterators timed after a warm-up: runs of one block
# in 65,536-row windows read at 0.91x the streaming order, 4096-row runs in 81,920-row
# windows at 0.98-1.07x (benchmarks.checkpoints), and their batch-mates share a batch
# again next epoch at 0.063% (0.056% before; rows layout 0.072%, ideal 0.051%;
# benchmarks.mixing). 4096-row runs in 65,536-row windows were as fast but mixed worse
# than the rows layout by one measure (reach 98.5% against 98.8%); 131,072-row windows
# were slower (a wider gather).
RUN_ROWS = 1 << 12
SEEKABLE_WINDOW_ROWS = 80 << 10
# Windows of the seekable order parsed at once. On a 16-vCPU H100 host (2026-11-27, numeric
# corpus, batch 4096, long-lived iterator) 16 windows in flight gave 4.2M rows/s, 8 gave
# 5.7M and 4 5.9M; on 8 vCPUs 8 and 4 were equal (5.3M, 5.2M). Threads added to the reads
# slowed that host too: past ~8, threads contend rather than add work done.
WINDOW_CALLS = 8


def window_calls(cpu_count: int, requested: int | None = None) -> int:
    """Windows the seekable order parses at once: one a core, at most WINDOW_CALLS."""
    if requested is not None:
        return requested
    return max(1, min(cpu_count, WINDOW_CALLS))


def block_window(block_rows: int, blocks: int, requested: int | None = None, *, rows: int = WINDOW_ROWS) -> int:
    """Blocks parsed (and their rows permuted) together: >= `rows` rows, capped at `blocks`."""
    if requested is not None:
        return requested
    return max(1, min(blocks, -(-rows // max(block_rows, 1))))


def block_run(block_rows: int, requested: int | None = None) -> int:
    """Consecutive blocks of a shard the seekable order reads as one: RUN_ROWS rows' worth."""
    if requested is not None:
        return requested
    return max(1, RUN_ROWS // max(block_rows, 1))


def block_shuffle_buffer(window: int, blocks: int, avg_block_bytes: float, *, requested: int | None = None) -> int:
    """Blocks in the block-level shuffle buffer: SHUFFLE_TARGET_BYTES of them, at least a
    window's worth, capped at `blocks`.

    The buffer decides which blocks meet in a window, so how far apart in the shards a
    window's rows come from. The same byte budget as the rows layout's record buffer holds
    ~4x the rows here (blocks are ~4x denser), and measured on the 500k-row benchmark
    corpus (benchmarks.mixing) it mixes better: batch-mates re-share a batch next epoch
    at 0.056% against 0.072% for the rows layout (ideal 0.051%); a buffer of one
    window (64 blocks) scored 0.090%.
    """
    if requested is not None:
        return requested
    by_memory = int(SHUFFLE_TARGET_BYTES / max(avg_block_bytes, 1.0))
    return max(1, min(blocks, max(window, by_memory)))


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
    counts: tuple  # records (TFRecords) in each of `files`
    records: int  # records this pipeline will see
    record_shard: tuple | None = None  # (num_shards, index) for record-level sharding
    rows: tuple | None = None  # rows in each of `files` when a record is a block of rows; None: one row each

    @property
    def total_rows(self) -> int | None:
        """Rows this pipeline will see; None when it reads some blocks of every file (their rows are unknown)."""
        if self.rows is None:
            return self.records
        return sum(self.rows) if self.record_shard is None else None


def dealt_files(files: int, *, num_pipelines: int, pipeline_id: int) -> range | None:
    """The files input pipeline `pipeline_id` of `num_pipelines` reads whole, dealt round
    robin when there are at least as many files as pipelines; None when it reads records
    of every file (one pipeline, or fewer files than pipelines)."""
    if num_pipelines <= 1:
        return None
    if not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"input pipeline id {pipeline_id} is out of range for {num_pipelines} pipelines")
    return range(pipeline_id, files, num_pipelines) if files >= num_pipelines else None


def shard_files(files, records, *, num_pipelines: int, pipeline_id: int, rows=None) -> FileShards:
    """File-level sharding across input pipelines, record-level when files are too few.

    `rows`: rows per file when a record is a block of rows (the blocks layout); with too
    few files, blocks are then sharded one by one.
    """
    files, records = tuple(files), tuple(records)
    rows = None if rows is None else tuple(rows)
    if num_pipelines <= 1:
        return FileShards(files, records, sum(records), rows=rows)
    mine = dealt_files(len(files), num_pipelines=num_pipelines, pipeline_id=pipeline_id)
    if mine is not None:
        counts = tuple(records[i] for i in mine)
        mine_rows = None if rows is None else tuple(rows[i] for i in mine)
        return FileShards(tuple(files[i] for i in mine), counts, sum(counts), rows=mine_rows)
    total = sum(records)
    count = math.ceil((total - pipeline_id) / num_pipelines) if total > pipeline_id else 0
    return FileShards(files, records, count, (num_pipelines, pipeline_id), rows=rows)
