"""The option objects `make_dataset` takes: how to read (`ReadOptions`), how to decode images (`ImageOptions`).

Both are frozen and check themselves when built; neither needs TensorFlow, so they can be
built (and their errors seen) on a machine without it.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["ReadOptions", "ImageOptions"]


def _check_positive(name, value, *, allow_zero=False):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        low = 0 if allow_zero else 1
        raise ValueError(f"ReadOptions.{name} must be an integer >= {low} or None (automatic), got {value!r}")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How `make_dataset` builds its tf.data graph. None means "decide automatically".

    (Formerly `PipelineOptions`, a name Beam uses for its own options; that name still works, deprecated.)

    cycle_length: shards read at once by the interleave. Auto: all shards up to 2x the
        CPUs this process may use (its affinity: `taskset`, a container's cpuset) on local
        disk, up to 16 on object storage (gs://), where each read has tens of ms of latency
        to hide.
    num_parallel_calls: parallelism of interleave and maps. Auto: tf.data AUTOTUNE (see autotune), except
        the interleave on object storage (gs://), which gets one call per shard read
        at once (latency-bound reads need threads, not cores), and the blocks layout's
        seekable order, which parses one window a core, at most 8 at once (on a 16-vCPU
        host, 16 windows at once read 4.2M rows/s where 8 read 5.7M).
    shuffle_buffer: rows layout only: records in the shuffle buffer. Auto: ~16 MB worth of records (from
        the recorded average record size; 50k records of the benchmark schema), capped at
        the split size. Conversion already shuffled records across shards, so the buffer
        only needs to vary epoch order; 64 MB measured ~20% slower per epoch (refill).
    block_window: blocks layout only: blocks parsed by one call, whose rows are then
        permuted together (with `shuffle`) before batching. Auto: enough blocks for 65,536
        rows (81,920 in the seekable order, see block_run), or the whole split when smaller.
        The issue's prototype measured ~65k-row windows (64 blocks of 1024 rows) at 8x the
        hand-tuned row pipeline and 16k-row windows at 5.2x; the permutation within the
        window is the finest mixing level, and 65k rows is a little more than the rows
        layout's ~50k-record shuffle buffer.
    block_shuffle_buffer: blocks layout only: blocks in the shuffle buffer ahead of the
        windows, which decides which blocks share a window each epoch. Auto: 16 MB of
        blocks (the rows layout's record-buffer budget, holding ~4x the rows), at least
        one window, capped at the split. Measured (benchmarks.mixing, 500k rows): batch-
        mates share a batch again next epoch at 0.056%, rows layout 0.072%, ideal 0.051%;
        a one-window buffer scored 0.090%.
    block_run: blocks layout, seekable order only: consecutive blocks of a shard read by
        one reader, which share a window every epoch. Auto: 4,096 rows' worth (4 blocks of
        1024 rows); its window is then >= 81,920 rows (80 blocks). A reader costs ~120 us
        beyond its bytes, more than a 1024-row block's read; runs of 4 blocks in 80-block
        windows read 1.05x as fast as single blocks in 64-block windows (benchmarks.
        checkpoints) and mix better than the rows layout (benchmarks.mixing). 1 gives the
        finest mixing.
    canonical_pipelines: blocks layout, seekable order, num_epochs=None and a seed: deal the
        split to this many canonical partitions, each with its own seekable order and an
        equal part of every batch; each input pipeline (their number must divide it)
        joins the batches of its partitions. The rows of global batch N are then the same
        for any number of pipelines, so a run can resume at a step (`start_batch`,
        `distribute(start_step=...)`) with more or fewer workers at the same global batch
        size, every remaining record delivered once. Default None: partitions are the
        pipelines themselves (faster to start: one seekable pipeline each, not C / M).
    seekable_order: blocks layout only: read blocks in runs at their byte offsets, in an
        order that is a pure function of (seed, epoch), so that an iterator checkpoint
        (`tf.train.Checkpoint(iterator=it)`) holds a few integers and a restored iterator
        seeks to its next batch. Default True (measured: 3-5.3 KB checkpoints; 0.98-1.07x
        the streaming order's examples/s in the steady state of a long-lived iterator,
        ~0.70x with an iterator per epoch, which pays a slower start;
        benchmarks.checkpoints). False: the streaming pipeline (shard interleave, then a
        block shuffle buffer), whose checkpoints hold its buffers. Gzip-compressed datasets,
        `skip_corrupt`, the tf.data service and `cache` always use the streaming pipeline.
    read_buffer_bytes: TFRecordDataset read buffer per shard. Auto: 1 MB local,
        8 MB on object storage (fewer, larger ranged reads).
    prefetch: batches prefetched at the end. Auto: AUTOTUNE (a buffer that grows while the
        consumer finds it empty).
    parse_block: records per parse_example call; parsed blocks are then re-batched to
        `batch_size`. Auto: max(batch_size, 1024). parse_example has a large fixed cost per
        call: 1024-record blocks parse 1.3-1.5x faster than 256-record batches here.
    autotune: tf.data's model-based autotuning (a thread that models the pipeline and
        re-tunes parallelism and buffers, fed by timings of every element). Default False:
        parallel stages run min(16, cores) calls at once (tf.data's AUTOTUNE value when
        the model is off), prefetch grows its own buffer as the consumer waits, and this
        library sizes the rest from the metadata. Measured (2 cores, 500k-row corpus, same
        process, 2026-11-24): autotune off was 13-25% faster on both layouts (blocks
        875k vs 796k examples/s one-epoch iterators, 1.61M vs 1.31M long-lived; rows 241k
        vs 207k), used ~10% less CPU, and deleting an iterator no longer stalled 0.2-0.6 s
        waiting for the model thread. True: for user `preprocess` functions whose best
        parallelism is unknown.
    ram_budget_bytes / cpu_budget: autotune budgets (with autotune=True). Auto: tf.data
        defaults (half of RAM, all cores). `diagnose` also takes ram_budget_bytes as the
        memory that batches in flight may use.
    cache_budget_bytes: `cache="auto"` caches in memory when the split fits. Auto: a
        quarter of physical RAM.
    private_threadpool_size: dedicated tf.data threads. Auto: tf.data's shared pool.
    max_intra_op_parallelism: threads one op may use. Auto: 1, as the tf.data guide
        advises for input pipelines (parallelism comes from parallel calls).
    symbolic_checkpoint: tf.data's symbolic checkpoints (each stage's position, not its
        buffered elements). Auto (None) and False: off. The blocks layout's seekable order
        checkpoints without them: its iterators save their position (five integers;
        docs/distribution.md), and tf.data's bookkeeping cost it 0.53-0.79 of its rate on
        2 cores (BENCHMARKS.md, #45). True gives tf.data's instead: for an iterator past a
        stage that is not one batch per batch (batch, filter...), whose checkpoint would
        otherwise hold the buffers in flight. Canonical partitions use them unless False.
        Elsewhere True is slow: on the 21-feature rows benchmark it cut
        throughput from 151k to 11k examples/s (TF 2.21, 2 cores). It also rules out
        skipping corrupt records (tf.data cannot checkpoint ignore_errors symbolically: a
        corrupt record then fails with TensorFlow's own error, which does not name the
        file, and `skip_corrupt` is refused; missing shards and record counts that
        disagree with the metadata are still named), and block parsing (tf.data cannot
        checkpoint rebatch).
    service_timeout_s: with `service=...`, how long the trainer waits for a batch before
        it raises an error naming the dispatcher and saying a worker was most likely lost
        (TensorFlow's service client can otherwise wait forever for a killed worker). Auto:
        60 s, no shorter than TF's default dispatcher worker timeout (a worker is declared
        dead after a minute or more without heartbeats). Set it above the slowest batch.
    """

    cycle_length: int | None = None
    num_parallel_calls: int | None = None
    parse_block: int | None = None
    shuffle_buffer: int | None = None
    block_window: int | None = None
    block_shuffle_buffer: int | None = None
    block_run: int | None = None
    canonical_pipelines: int | None = None
    read_buffer_bytes: int | None = None
    prefetch: int | None = None
    ram_budget_bytes: int | None = None
    cpu_budget: int | None = None
    cache_budget_bytes: int | None = None
    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None
    symbolic_checkpoint: bool | None = None
    seekable_order: bool = True
    autotune: bool = False
    service_timeout_s: float | None = None

    def __post_init__(self):
        for name in (
            "cycle_length",
            "num_parallel_calls",
            "parse_block",
            "shuffle_buffer",
            "block_window",
            "block_shuffle_buffer",
            "block_run",
            "canonical_pipelines",
            "read_buffer_bytes",
            "ram_budget_bytes",
            "cpu_budget",
            "cache_budget_bytes",
            "private_threadpool_size",
            "max_intra_op_parallelism",
        ):
            _check_positive(name, getattr(self, name))
        _check_positive("prefetch", self.prefetch, allow_zero=True)
        for name in ("symbolic_checkpoint", "seekable_order", "autotune"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "symbolic_checkpoint" and value is None):
                raise ValueError(f"ReadOptions.{name} must be a bool, got {value!r}")
        t = self.service_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf):
            raise ValueError(
                f"ReadOptions.service_timeout_s must be a positive number of seconds or None (automatic: 60), got {t!r}"
            )


IMAGE_DTYPES = ("bfloat16", "float32", "uint8")
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _range(name: str, value, *, high: float) -> tuple:
    """A (min, max) pair with 0 < min <= max <= high, as floats; ValueError naming `name` otherwise."""
    bound = "1" if high == 1.0 else "inf"
    try:
        low_v, high_v = (float(v) for v in value)
    except (TypeError, ValueError):
        low_v = high_v = math.nan
    if isinstance(value, (str, bytes)) or not (0 < low_v <= high_v <= high):
        raise ValueError(
            f"ImageOptions.{name} must be a (min, max) pair with 0 < min <= max <= {bound}, got {value!r}"
            + (" (None takes no random crop)" if name == "crop_area" else "")
        )
    return (low_v, high_v)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How `make_dataset` decodes, augments and finishes the images of an image dataset.

    size: (height, width) of the images it yields.
    training: True augments: a random resized crop (for JPEGs only the crop is decoded)
        and a random left-right flip, as set below. False takes the central 87.5% crop,
        the usual evaluation transform, the same pixels every pass. None (the default):
        True when `make_dataset` reads the "train" split with `shuffle=True`, else False,
        so evaluation is never augmented unless asked.
    crop_area: (min, max) fraction of the image's area the random crop covers, 0 < min <=
        max <= 1. (0.08, 1.0), the Inception/ResNet recipe, by default. None: no random
        crop, the whole image is resized (the flip alone).
    crop_aspect: (min, max) width/height ratio of the random crop, 0 < min <= max;
        (3/4, 4/3) by default.
    flip: a random left-right flip when training.
    crop_small: also crop images no larger than `size` on both sides (randomly when
        training, centrally when not). False (the default) takes them whole: a crop of
        such an image only upsamples fewer of its pixels (an 8x8 digit cropped to 8%
        keeps 5 of its 64 pixels).
    channels: 3 (RGB) or 1 (grayscale).
    dtype: "float32", "bfloat16" or "uint8".
    normalize: None (pixel values 0-255), "unit" ([0, 1]), "imagenet" (ImageNet mean and
        std) or (mean, std), per channel in [0, 1] units. "default": "unit" for float
        dtypes, None for uint8 (which cannot hold anything else).
    """

    size: tuple
    training: bool | None = None
    channels: int = 3
    dtype: str = "float32"
    normalize: object = "default"
    # The Inception/ResNet random-resized-crop ranges.
    crop_area: tuple | None = (0.08, 1.0)
    crop_aspect: tuple = (3.0 / 4.0, 4.0 / 3.0)
    flip: bool = True
    crop_small: bool = False

    def __post_init__(self):
        try:
            height, width = (int(v) for v in self.size)
        except (TypeError, ValueError):
            raise ValueError(f"image size must be (height, width), got {self.size!r}") from None
        if height < 1 or width < 1:
            raise ValueError(f"image size must be positive, got {self.size!r}")
        object.__setattr__(self, "size", (height, width))  # lists and NumPy ints in, a hashable pair out
        if self.training not in (True, False, None):
            raise ValueError(
                f"training must be True, False or None (True for the shuffled train split), got {self.training!r}"
            )
        if self.crop_area is not None:
            object.__setattr__(self, "crop_area", _range("crop_area", self.crop_area, high=1.0))
        object.__setattr__(self, "crop_aspect", _range("crop_aspect", self.crop_aspect, high=math.inf))
        for name in ("flip", "crop_small"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ImageOptions.{name} must be True or False, got {getattr(self, name)!r}")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {self.channels!r}")
        if self.dtype not in IMAGE_DTYPES:
            raise ValueError(f"image dtype must be one of {list(IMAGE_DTYPES)}, got {self.dtype!r}")
        normalize = self.normalize
        if isinstance(normalize, (tuple, list)) and len(normalize) == 2:
            try:
                mean, std = (tuple(float(v) for v in part) for part in normalize)
            except (TypeError, ValueError):
                raise ValueError(f"normalize=(mean, std) needs two sequences of numbers, got {normalize!r}") from None
            if len(mean) != self.channels or len(std) != self.channels or min(std) <= 0:
                raise ValueError(
                    f"normalize=(mean, std) needs {self.channels} values each and positive std, got {normalize!r}"
                )
            object.__setattr__(self, "normalize", (mean, std))
        elif normalize == "imagenet" and self.channels != 3:
            raise ValueError(
                "normalize='imagenet' needs channels=3 (its mean and std are per RGB channel), "
                f"got channels={self.channels!r}"
            )
        elif not (normalize is None or (isinstance(normalize, str) and normalize in ("default", "unit", "imagenet"))):
            raise ValueError(f"normalize must be None, 'unit', 'imagenet' or (mean, std), got {normalize!r}")
        if self.dtype == "uint8" and self.scale:
            raise ValueError("image dtype 'uint8' keeps pixel values 0-255: use normalize=None, or a float image dtype")

    @property
    def scale(self) -> bool:
        """Whether pixel values are divided by 255 (every normalization but None)."""
        if isinstance(self.normalize, str) and self.normalize == "default":
            return self.dtype != "uint8"
        return self.normalize is not None

    @property
    def mean_std(self) -> tuple | None:
        """(mean, std) per channel in [0, 1] units, or None when there is no mean/std step."""
        if isinstance(self.normalize, tuple):
            return self.normalize
        return IMAGENET_MEAN_STD if self.normalize == "imagenet" else None
