"""The blocks layout in a seekable order: each epoch's order a pure function of (seed, epoch).

    window index w = 0, 1, 2, ...                 (a range: its position is the iterator's state)
      -> (seed, fingerprint, pass, w)             (carried by scan, so a checkpoint keeps them)
      -> window w: rows [w*M, (w+1)*M) of the stream of epochs, where epoch e lists this
         pipeline's blocks as a permutation, keyed by (seed, e), of runs of consecutive
         blocks of a shard; those blocks are read at their byte offsets (one reader per
         run met in the window), parsed by one call, and the window's rows gathered in a
         permutation keyed by (seed, w)
      -> [pad] -> [(features, label)] -> the window's batches (M is a multiple of the batch
         size, so only the stream's last batch can be short)

Three levels of mixing, like the streaming block pipeline it replaces: which blocks meet
in a window changes every epoch (any block with any other, not only those a buffer
holds), rows are permuted within the window, and conversion shuffled rows into blocks.

A checkpoint is the position: make_dataset's iterators save (seed, pass, batch) and a
restored one starts at that batch (ingest.pipeline._restore arms `Resume`, which the first element
of the next iterator reads, as it reads `start_batch`). It seeks, it does not replay: it
recomputes the window it stopped in. Without a user seed one is drawn when the dataset is
built, and a restore brings the checkpoint's. The fingerprint of the blocks, batch size
and window is checked against the dataset restored into: a checkpoint of another dataset
(or of another batch size, or of another seed than one given) is refused instead of
resuming into a different order. Asked for tf.data's symbolic checkpoints (and for
canonical partitions), the graph serves those too: nothing in it keeps data a checkpoint
would have to save (the parallel map, flat_map and prefetch are checkpointed by position,
the scans keep seed, pass and fingerprint), and the same checks run in the graph.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import random
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from ingest import contract
from ingest.pipeline import _parse, _read, _restore, _tuning
from ingest.pipeline._functions import own_functions
from ingest.pipeline._request import read_start
from ingest.pipeline._system import usable_cpus
from ingest.pipeline.blocks.index import BlockIndex
from ingest.pipeline.blocks.parse import check_blocks, check_rows, format_message, located_in, parse_blocks

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["positioned_block_batches", "seekable", "seekable_block_batches", "seekable_windows", "window_rows"]

logger = logging.getLogger(__name__)

_PASSES = 1 << 30  # pass numbers drawn per iterator
# Empty windows ahead of the first: one per flat_map level below the read (windows, reads,
# batches). Measured: with two, a restore inside the first window reads the variable again.
_HEADS = 3
_FOREVER = 2**62  # windows in an endless stream (repeated, so the cardinality is infinite)
_MAX_READ_BUFFER = 4 << 20  # a reader's buffer: a run's bytes, up to this
# Where a window's blocks are read: by one thread for every window (False), or by the
# window's own parse call, as many at once as windows are parsed (True). The reads are
# TensorFlow's TFRecord reader, CRC checks included, ~1 GB/s of one core: one thread
# read ~23M rows/s of the numeric corpus here, and on the 16-vCPU H100 host, whose cores
# ran this pipeline ~4x slower, that is near the 6.7M rows/s its 16 cores reached. Off:
# on 2 cores here reading in the calls was ~5% slower (9.1-9.4M against 9.5-10.2M rows/s,
# two alternating runs), and tf.data logs once a window that the map is stateful.
# benchmarks/device_probe.py measures both on a GPU host.
READS_IN_WINDOW_CALLS = False


def window_rows(block_rows: int, blocks: int, batch_size: int, requested_blocks: int | None = None) -> int:
    """Rows permuted together: `block_window` blocks' worth, rounded up to whole batches.

    A window that is a multiple of the batch size lets every batch come from one window,
    so no state crosses a window boundary.
    """
    window = _tuning.block_window(block_rows, blocks, requested=requested_blocks, rows=_tuning.SEEKABLE_WINDOW_ROWS)
    rows = window * block_rows
    return max(1, -(-rows // batch_size)) * batch_size


def _fingerprint(index: BlockIndex, *parts) -> int:
    h = hashlib.sha256(index.fingerprint().to_bytes(8, "little"))
    h.update(repr(parts).encode())
    return int.from_bytes(h.digest()[:8], "little") >> 2


def _check_shards_once(req: Request, index: BlockIndex) -> None:
    """Each shard's recorded fingerprint against its ends, once per process, as the order is
    built (its block index is read then too): a py_function in this graph, as the other
    orders check, makes tf.data log a warning per window that the graph holds state."""
    if req.service is not None:
        return
    # The index names every shard of the split; this pipeline reads, and checks, its own.
    files = [index.files[i] for i in np.unique(index.file_of)]
    shards = zip(files, _read.recorded_shards(req, files))
    listed = [(f, s.bytes, s.fingerprint) for f, s in shards if s is not None and s.fingerprint]
    if not _tuning.is_remote(req.path):
        _read.check_shards(listed, skip_corrupt=req.skip_corrupt)
        return
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # two small requests a shard, 8 at once
        list(pool.map(lambda shard: _read.check_shards([shard], skip_corrupt=req.skip_corrupt), listed))


def _draw_seed() -> int:
    return random.SystemRandom().randrange(1, 2**62)


def _block_reads(index: BlockIndex, req: Request):
    """[n] block positions -> a dataset of their serialized records, read at their byte offsets.

    One TFRecord reader per run of blocks that follow each other in a file, its buffer the
    run's frames exactly, up to 4 MB (a larger one reads bytes the run does not use: 256 KB
    buffers measured 25% slower on single 88 KB blocks).
    """
    files = tf.constant(list(index.files))
    file_of = tf.constant(index.file_of)
    offsets = tf.constant(index.offsets)
    lengths = tf.constant(index.lengths)
    per_file = tf.constant(np.bincount(index.file_of, minlength=len(index.files)).astype(np.int64))
    remote = _tuning.is_remote(req.path)
    spec = tf.TensorSpec([], tf.string)

    def one(position, name, offset, length, count):
        variant = tf.raw_ops.TFRecordDatasetV2(
            filenames=tf.reshape(name, [1]),
            compression_type="",
            buffer_size=tf.minimum(length, _MAX_READ_BUFFER),
            byte_offsets=tf.reshape(offset, [1]),
        )
        # No ignore_errors (tf.data cannot checkpoint it symbolically): a block failing its
        # CRC raises TensorFlow's DataLossError, which names its byte offset, not the file.
        # Zipped with its positions rather than mapped: a map would run a function per block.
        records = tf.data.experimental.from_variant(variant, spec).take(count)
        return tf.data.Dataset.zip((tf.data.Dataset.range(position, position + count), records))

    def reads(blocks):
        """The blocks' records, each with its position in `blocks`, and a check that the files exist.

        Blocks that follow each other in a file are read by one reader: a reader costs
        ~120 us beyond its bytes, more than a 1024-row block's ~75 us of sequential read.
        """
        which = tf.gather(file_of, blocks)
        names = tf.gather(files, which)
        at, size = tf.gather(offsets, blocks), tf.gather(lengths, blocks)
        # A run starts where a block's (file, offset) is not the (file, end) of the block before.
        here, after = tf.stack([which, at]), tf.stack([which, at + size])
        breaks = tf.reduce_any(tf.not_equal(here[:, 1:], after[:, :-1]), axis=0)
        starts = tf.concat([[True], breaks], 0)[: tf.size(blocks)]  # no blocks: no run
        segment = tf.cumsum(tf.cast(starts, tf.int64)) - 1
        first = tf.cast(tf.where(starts)[:, 0], tf.int64)
        runs = tf.size(first, out_type=tf.int64)
        # On object storage a listing per window would be a request per window, and its error
        # would name the directory: there TensorFlow's own NotFoundError names the missing object.
        checks = [] if remote else [_files_exist(names, tf.gather(per_file, which))]
        with tf.control_dependencies(checks):
            first = tf.identity(first)
        ds = tf.data.Dataset.from_tensor_slices(
            (
                first,
                tf.gather(names, first),
                tf.gather(at, first),
                tf.math.unsorted_segment_sum(size, segment, runs),
                tf.math.unsorted_segment_sum(tf.ones_like(size), segment, runs),
            )
        )
        return ds.flat_map(one)

    return reads


def _files_exist(names, blocks_per_file) -> tf.Operation:
    """Fails naming the first of `names` (the window's blocks' files) that does not exist.

    Each file is looked up once per window before its blocks are opened, for an error that
    says what is missing and what to do.
    """
    unique, which = tf.unique(names)
    listed = tf.math.unsorted_segment_max(blocks_per_file, which, tf.size(unique))
    found = tf.io.matching_files(_read.glob_escaped(unique))
    present = tf.reduce_any(tf.equal(tf.expand_dims(unique, 1), tf.expand_dims(found, 0)), axis=1)
    # The first missing file, if any (a where and a gather: a boolean_mask is ~20 ops).
    missing = tf.where(tf.logical_not(present))[:1, 0]
    return tf.debugging.Assert(
        tf.reduce_all(present),
        [
            tf.strings.join(
                [
                    "shard ",
                    tf.strings.reduce_join(tf.gather(unique, missing)),
                    f" is missing: {contract.METADATA_FILENAME} lists it with ",
                    tf.strings.reduce_join(tf.strings.as_string(tf.gather(listed, missing))),
                    " blocks, but the file does not exist (deleted or moved after conversion?). Restore the "
                    "file or reconvert the dataset, or pass skip_corrupt=True to skip its records.",
                ]
            )
        ],
    )


def _all_read(positions, blocks, index: BlockIndex, names) -> tf.Operation:
    """Fails naming the first block of the window that was not there to read."""
    read = tf.scatter_nd(
        tf.expand_dims(positions, 1), tf.ones_like(positions), tf.reshape(tf.size(blocks, out_type=tf.int64), [1])
    )
    in_shard, offsets = tf.constant(index.block_in_shard), tf.constant(index.offsets)
    return check_blocks(
        read > 0,
        lambda i: format_message(
            [
                "shard ",
                tf.gather(names, i),
                " ends before its block ",
                tf.gather(in_shard, tf.gather(blocks, i)),
                " (byte offset ",
                tf.gather(offsets, tf.gather(blocks, i)),
                "): it was cut after the dataset was built. Reconvert the dataset, or pass skip_corrupt=True "
                "to skip the rest of a bad shard.",
            ]
        ),
    )


def block_runs(index: BlockIndex, run: int) -> tuple:
    """Runs of up to `run` blocks that follow each other in one shard file, in index order:
    (first block, blocks) of each.

    Blocks dealt round robin to input pipelines are not neighbours in their file: each
    is a run of its own (runs are for reading together, and only neighbours can be).
    """
    n = len(index)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ends = index.offsets + index.lengths
    follows = (index.file_of[1:] == index.file_of[:-1]) & (index.offsets[1:] == ends[:-1])
    stretch_start = np.maximum.accumulate(np.where(np.concatenate([[True], ~follows]), np.arange(n), 0))
    starts = np.flatnonzero((np.arange(n) - stretch_start) % run == 0)
    return starts.astype(np.int64), np.diff(np.append(starts, n)).astype(np.int64)


def _key(passes, index):
    """A stateless-seed half for epoch or window `index` of pass `passes` over the dataset."""
    return passes * (1 << 32) + index


def _within_epochs(n, seed, key, w, window: int, total_rows: int):
    """A permutation of the window's `n` rows keyed by (seed, w) that keeps each epoch's rows together.

    A window may straddle epochs (its size is a multiple of the batch size, not of the
    split): its rows are permuted within each epoch's part, so every epoch of the stream
    is still a permutation of the split, and the epochs follow each other.
    """
    permutation = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([seed, 2 * key + 1]))
    start = w * window
    epoch_of = (start + permutation) // total_rows
    return tf.cond(
        tf.equal(start // total_rows, (start + n - 1) // total_rows),
        lambda: permutation,
        lambda: tf.gather(permutation, tf.argsort(epoch_of, stable=True)),
    )


def _row_count(columns):
    """[rows] of a window's columns, as a vector of one (the first dimension they share)."""
    for x in columns:
        if not isinstance(x, tf.RaggedTensor):
            return tf.slice(tf.shape(x, out_type=tf.int64), [0], [1])
    return tf.reshape(columns[0].nrows(), [1])


def _ragged_split(x: tf.RaggedTensor, whole, tail, n, axis) -> tuple:
    """A ragged column's rows [0, whole) and [whole, n) (`whole`, `tail` = n - whole and `n`
    are [1] vectors): its values split by one op, its row splits cut where they meet.

    Slicing it (`x[:whole]`, `x[whole:]`) took ~150 ops of a window's function, asserts
    included, where this takes ~15.
    """
    if x.ragged_rank > 1:
        return x[: tf.reshape(whole, [])], x[tf.reshape(whole, []) :]
    s = x.row_splits
    cut = tf.gather(s, whole)  # [1]: where the tail's values start
    head_values, tail_values = tf.split(x.values, tf.concat([cut, tf.gather(s, n) - cut], 0), axis=axis)
    head = tf.RaggedTensor.from_row_splits(head_values, tf.slice(s, tf.zeros([1], tf.int64), whole + 1), validate=False)
    rest = tf.RaggedTensor.from_row_splits(tail_values, tf.slice(s, whole, tail + 1) - cut, validate=False)
    return head, rest


def _reshaper(lead):
    """x -> x reshaped to `lead` (a vector) and its inner dimensions.

    The shape vector is made once per inner shape, not per tensor: every op of a tf.data
    function costs time whenever an iterator is made, and a window has a tensor per column.
    """
    shapes = {}

    def reshape(x):
        inner = x.shape[1:]
        if not inner.is_fully_defined():
            return tf.reshape(x, tf.concat([lead, tf.shape(x, out_type=tf.int64)[1:]], 0))
        key = tuple(inner.as_list())
        if key not in shapes:
            shapes[key] = tf.concat([lead, tf.constant(key, tf.int64)], 0) if key else lead
        return tf.reshape(x, shapes[key])

    return reshape


def seekable_block_batches(req: Request, index: BlockIndex) -> tf.data.Dataset:
    """Batches of this pipeline's blocks in the (seed, epoch) order, as a symbolically checkpointable dataset."""
    return _SeekableOrder(req, index).batches()


def positioned_block_batches(req: Request, index: BlockIndex) -> tuple:
    """(batches, their Resume): the same order, whose iterators checkpoint their position
    (ingest.pipeline._restore) where tf.data's symbolic checkpoints are off."""
    order = _SeekableOrder(req, index)
    order.resume = _restore.Resume(
        seed=order.seed,
        fingerprint=order.fingerprint,
        given_seed=req.seed,
        other_dataset=order.other_dataset(),
        other_seed=order.other_seed,
    )
    return order.batches(), order.resume


def seekable_windows(req: Request, index: BlockIndex) -> tuple:
    """(dataset of (w, window rows), rows a window holds): the order's windows before batching."""
    order = _SeekableOrder(req, index)
    return order.parsed_windows(), order.window


class _SeekableOrder:
    """The seekable order's stages, each a function of the pipeline's fixed facts (set here):

    starts -> windows_of_pass -> scan(keep) -> plan -> read -> rows_of_window -> window_batches
    """

    def __init__(self, req: Request, index: BlockIndex):
        self.req, self.index = req, index
        self.features = _parse.selected_features(req)
        self.padded = _parse.padder(req)
        self.split_label = _parse.label_splitter(req) or (lambda rows: rows)
        self.batch = req.batch_size
        self.total_rows = int(index.rows.sum())
        self.window = window_rows(req.info.block_rows, len(index), self.batch, req.options.block_window)
        self.stream = None if req.num_epochs is None else self.total_rows * req.num_epochs
        self.windows = _FOREVER if self.stream is None else -(-self.stream // self.window)
        self.seed = req.seed if req.seed is not None else _draw_seed()
        run = _tuning.block_run(req.info.block_rows, req.options.block_run)
        self.fingerprint = _fingerprint(
            index, self.batch, self.window, req.shuffle, req.num_epochs, req.drop_remainder, run
        )
        # A pipeline without rows (more pipelines than blocks) reads no window, head or not.
        self.heads = _HEADS if self.total_rows else 0
        self.rows_of = tf.constant(index.rows)
        self.in_shard = tf.constant(index.block_in_shard)
        self.files = tf.constant(list(index.files))
        self.file_of = tf.constant(index.file_of)
        self.num_blocks = len(index)
        self.reads = _block_reads(index, req)
        _check_shards_once(req, index)
        self.shuffle = req.shuffle
        self.run_starts, self.run_lengths = (tf.constant(a) for a in block_runs(index, run))
        self.num_runs = int(self.run_starts.shape[0])
        # Only the stream's last window can end in a short batch (every window is whole batches).
        self.short_tail = self.stream is not None and self.stream % self.batch != 0
        self.resume = None  # an _restore.Resume: where a restore starts the next iterator

    def batches(self) -> tf.data.Dataset:
        # Each new iterator over the dataset is a new pass (as with tf.data's
        # reshuffle_each_iteration: Keras iterates a finite dataset anew every epoch), whose
        # number is drawn once per iterator from a random dataset seeded by the seed, so the
        # passes of a seed are the same in every run with the same TensorFlow global seed
        # (tf.data combines it with an op's). (A variable's assign_add, the counter
        # this replaces, is an op tf.data warns of three times per iterator.) The scan's
        # state keeps the pass, the seed and the fingerprint: a checkpoint restores them
        # (tf.data restores a flat_map's inner iterator by replaying its position, not its
        # state, so the scan stands outside it).
        ds = self.starts().flat_map(self.windows_of_pass)
        if self.stream is None:
            ds = ds.repeat()  # never repeats (the pass is endless); tells tf.data the cardinality is infinite
        ds = ds.scan(self.kept(), _keep)
        parallel = _tuning.window_calls(usable_cpus(), requested=self.req.options.num_parallel_calls)
        ds = ds.map(self.plan, num_parallel_calls=parallel, deterministic=True)
        if READS_IN_WINDOW_CALLS:
            ds = ds.map(self.read_and_parse, num_parallel_calls=parallel, deterministic=True)
        else:
            # Reads are a flat_map, not a dataset reduced inside a map: tf.data then checkpoints
            # them symbolically without a warning per window that the map is stateful.
            ds = ds.flat_map(self.read)
            ds = ds.map(self.rows_of_window, num_parallel_calls=parallel, deterministic=True)
        return ds.flat_map(self.window_batches)

    def parsed_windows(self) -> tf.data.Dataset:
        """(w, rows of window w): the order's windows whole, rows permuted, before any batch is cut.

        What a worker process of ingest.stream hands over: one element per window (the
        head elements come as windows numbered -1, with no rows).
        """
        ds = self.starts().flat_map(self.windows_of_pass)
        if self.stream is None:
            ds = ds.repeat()
        parallel = _tuning.window_calls(usable_cpus(), requested=self.req.options.num_parallel_calls)
        ds = ds.scan(self.kept(), _keep).map(self.plan, num_parallel_calls=parallel, deterministic=True)
        return ds.flat_map(self.read).map(self.numbered_rows, num_parallel_calls=parallel, deterministic=True)

    def kept(self) -> tuple:
        """_keep's first state: (seed, fingerprint, no pass yet)."""
        return tf.constant(self.seed, tf.int64), tf.constant(self.fingerprint, tf.int64), tf.constant(-1, tf.int64)

    def numbered_rows(self, seed, key, w, *rest):
        element, _ = self.rows_of_window(seed, key, w, *rest)
        return w, element

    def starts(self):
        """-> (pass, first batch, seed), after _HEADS head elements (first -1) that read the first batch.

        A restore replays each flat_map's current input element from its input's state
        saved before that element. A start_batch variable read by the element the windows
        come from would be read again then, when the step counter has moved on, and the
        restored iterator would seek elsewhere. So a scan reads it into its state (which a
        checkpoint saves) on head elements that flow through the stages as empty windows:
        by the first real window, every flat_map's saved input is past the read.
        """
        # A pass number of 30 bits: _key keeps it apart from the epoch or window index.
        if self.req.stream_pass is not None:
            # A worker of ingest.stream: the consumer drew the pass (as below, in the same
            # order of iterators) and every worker reads it from its variable per iterator.
            passes = tf.data.Dataset.range(self.heads + 1)
        else:
            passes = tf.data.Dataset.random(seed=self.seed % 2**31, rerandomize_each_iteration=True)
            passes = passes.take(self.heads + 1)
        # A variable may live on a GPU: the function that reads it is instantiated for all devices.
        state = tuple(tf.constant(v, tf.int64) for v in (0, -1, self.seed, -1))
        with own_functions(isinstance(self.req.start_batch, (int, type(None)))):
            return passes.scan(state, self.read_first)

    def read_first(self, state, r):
        """The first element reads where the iterator starts (pass, first batch, seed); every
        element carries them."""
        count, first, seed, this_pass = state

        def started():
            drawn = r % _PASSES
            if self.req.stream_pass is not None:
                drawn = tf.cast(self.req.stream_pass.read_value(), tf.int64)
            if self.resume is None:
                return tf.constant(self.seed, tf.int64), drawn, self.first_batch()
            return self.resume.start_of(drawn, self.first_batch)

        seed, this_pass, first = tf.cond(tf.equal(count, 0), started, lambda: (seed, this_pass, first))
        head = tf.where(count < self.heads, tf.constant(-1, tf.int64), first)
        return (count + 1, first, seed, this_pass), (this_pass, head, seed)

    def first_batch(self):
        """Where a new iterator starts: batch 0, or `start_batch` (a variable is read now)."""
        if self.req.start_batch is None:
            return tf.constant(0, tf.int64)
        return read_start(self.req.start_batch)

    def windows_of_pass(self, this_pass, first, seed):
        """-> (pass, window, batches of it to drop, seed); the head element: window -1, once."""
        # Seeking: whole windows before the first batch are not read; the first window
        # drops the batches before it (a window holds whole batches).
        head = first < 0
        w0, drop = first * self.batch // self.window, first * self.batch % self.window // self.batch
        minus_one, zero = tf.constant(-1, tf.int64), tf.constant(0, tf.int64)
        k, workers = self.req.window_slice
        if workers == 1:
            ds = tf.data.Dataset.range(tf.where(head, minus_one, w0), tf.where(head, zero, self.windows))
        else:  # a worker of ingest.stream: every K-th window, from its own first at or after w0
            mine = w0 + (k - w0) % workers
            step = tf.where(head, tf.constant(1, tf.int64), tf.constant(workers, tf.int64))
            ds = tf.data.Dataset.range(tf.where(head, minus_one, mine), tf.where(head, zero, self.windows), step)
        if self.stream is None:
            ds = ds.repeat(tf.where(head, -minus_one, minus_one))
        return ds.map(lambda w: (this_pass, w, tf.where(tf.logical_and(tf.equal(w, w0), w >= 0), drop, 0), seed))

    def epoch_orders(self, seed, this_pass, epochs):
        """[E] epochs -> [E, blocks]: each epoch's block order, keyed by (seed, pass, epoch).

        A permutation of runs of consecutive blocks, each run read by one reader. One
        vectorized op for every epoch of the window (a map over epochs would add a loop
        whose ops every new iterator pays for).
        """
        count = tf.size(epochs, out_type=tf.int64)
        if not self.shuffle:
            return tf.tile(tf.range(self.num_blocks, dtype=tf.int64)[None], tf.stack([count, 1]))
        # The op keys its permutation on 32 bits of each of three seed words: a 64-bit hash
        # of (seed, pass, epoch) fills two, so that no two of them share an order.
        keys = tf.strings.to_hash_bucket_fast(
            tf.strings.join([tf.strings.as_string(seed), tf.strings.as_string(_key(this_pass, epochs))], "/"), 2**63 - 1
        )
        keys = tf.stack([keys % 2**32, keys // 2**32, tf.zeros_like(keys)], axis=1)
        # Each epoch's key for each of its runs (a tile: tf.repeat takes ~25 ops).
        keys = tf.reshape(tf.tile(tf.expand_dims(keys, 1), [1, self.num_runs, 1]), [-1, 3])
        runs = tf.raw_ops.RandomIndexShuffle(
            index=tf.tile(tf.range(self.num_runs, dtype=tf.int64), [count]),
            seed=keys,
            max_index=tf.constant(self.num_runs - 1, tf.int64),
        )
        starts = tf.gather(self.run_starts, runs)
        order = tf.ragged.range(starts, starts + tf.gather(self.run_lengths, runs)).flat_values
        return tf.reshape(order, tf.stack([count, self.num_blocks]))

    def plan(self, seed, saved_fingerprint, this_pass, w, drop):
        """Window w -> the blocks it reads, and where each of its rows sits in them."""
        same = tf.debugging.Assert(tf.equal(saved_fingerprint, self.fingerprint), [self.other_dataset()])
        total_rows, stream = self.total_rows, self.stream
        start = w * self.window
        stop = start + self.window if stream is None else tf.minimum(start + self.window, stream)
        end = stop - 1
        epochs = tf.range(start // total_rows, end // total_rows + 1, dtype=tf.int64)
        orders = self.epoch_orders(seed, this_pass, epochs)
        # Where each epoch's blocks end in the stream. The window's rows are consecutive in
        # the stream, so they are consecutive in its blocks parsed in order: the blocks from
        # the one holding `start` to the one holding `end`, less `skip` rows at the head.
        rows = tf.gather(self.rows_of, orders)
        ends = tf.cumsum(rows, axis=1) + tf.expand_dims(epochs, 1) * total_rows
        orders = tf.reshape(orders, [-1])
        # searchsorted(side="right") without its reshapes (~15 ops): the op takes rows.
        bounds = tf.raw_ops.UpperBound(
            sorted_inputs=tf.reshape(ends, [1, -1]),
            values=tf.reshape(tf.stack([start, end]), [1, 2]),
            out_type=tf.int64,
        )
        first, last = tf.unstack(tf.reshape(bounds, [2]))
        skip = start - tf.gather(tf.reshape(ends - rows, [-1]), first)  # less the rows before the first block
        head = w < 0  # the head element: an empty window
        with tf.control_dependencies([same, *self.same_seed(seed)]):
            blocks = orders[first : tf.where(head, first, last + 1)]
        zero = tf.constant(0, tf.int64)
        return seed, _key(this_pass, w), w, blocks, tf.where(head, zero, skip), tf.where(head, zero, stop - start), drop

    def other_dataset(self) -> str:
        return (
            f"{_restore.MARK} of another dataset, batch size or window than {self.req.path} split "
            f"{self.req.split.name!r} with batch_size={self.batch}: its order would differ. Restore it into the "
            "make_dataset call it was saved from, or start without the checkpoint."
        )

    def other_seed(self, seed) -> str:
        return f"{_restore.MARK} saved with seed {seed} {self._seed_advice()}"

    def _seed_advice(self) -> str:
        return (
            f"into make_dataset(seed={self.req.seed}) of {self.req.path}: its order would differ. Restore it with "
            "the seed it was saved with (seed=None takes the checkpoint's), or start without the checkpoint."
        )

    def same_seed(self, seed) -> list:
        """A seed given to make_dataset must be the one a restored checkpoint carries: its
        order is the one asked for (without one, the checkpoint's seed is the run's)."""
        if self.req.seed is None:
            return []
        return [
            tf.debugging.Assert(
                tf.equal(seed, self.seed),
                [f"{_restore.MARK} saved with seed", seed, self._seed_advice()],
            )
        ]

    def read(self, seed, key, w, blocks, skip, rows, drop):
        # A block short of its frame (a file cut after indexing) yields nothing: _all_read names it.
        count = tf.size(blocks, out_type=tf.int64)
        serialized = self.reads(blocks).batch(tf.maximum(count, 1))
        # Every window passes on as one element: the head's empty one, and a window none of
        # whose blocks could be read (its shards cut to before them), for _all_read to name.
        empty = tf.data.Dataset.from_tensors((tf.zeros([0], tf.int64), tf.zeros([0], tf.string)))
        serialized = serialized.concatenate(empty).take(1)
        return serialized.map(lambda positions, s: (seed, key, w, blocks, positions, s, skip, rows, drop))

    def read_and_parse(self, seed, key, w, blocks, skip, rows, drop):
        """read and rows_of_window in one call: the window's blocks read where it is parsed."""
        return self.rows_of_window(*self.read(seed, key, w, blocks, skip, rows, drop).get_single_element())

    def rows_of_window(self, seed, key, w, blocks, positions, serialized, skip, rows, drop):
        names = tf.gather(self.files, tf.gather(self.file_of, blocks))
        with tf.control_dependencies([_all_read(positions, blocks, self.index, names)]):
            serialized = tf.identity(serialized)
        in_shard = tf.gather(self.in_shard, blocks)
        if self.shuffle:
            order = _within_epochs(rows, seed, key, w, self.window, self.total_rows)
        else:
            order = tf.range(rows)
        want = tf.gather(self.rows_of, blocks)
        rows = parse_blocks(
            serialized,
            self.features,
            locate=located_in(names, in_shard),
            codes=self.req.text_codes,
            ids=self.req.text_ids,
            masks=self.req.masks,
            take=skip + order,
            row_check=lambda got: check_rows(got, want, names, in_shard),
        )
        return self.split_label(self.padded(rows)), drop

    def window_batches(self, element, drop):
        """A window's rows -> its batches: a reshape per column (and a split, if the stream
        ends in a short batch), their shape vectors made once: every op here costs time
        whenever an iterator is made.

        Nothing here runs a function of its own: a window's batches are a new dataset, and
        a filter's predicate was instantiated for every window (~1.5 ms of ~40 ms of CPU a
        window takes at batch 256).
        """
        batch, keep_short = self.batch, not self.req.drop_remainder
        # Without drop_remainder the batch dimension is None, as the rows layout gives: a
        # batch size whose value the graph does not know.
        if keep_short:
            size = tf.raw_ops.PlaceholderWithDefault(input=tf.constant(batch, tf.int64), shape=[])
            reshape = _reshaper(tf.stack([-1, size]))
        else:
            size, reshape = batch, _reshaper(tf.constant([-1, batch], tf.int64))

        def batched(rows):
            if isinstance(rows, tf.RaggedTensor):
                # A window holds whole batches by construction (the stream's short tail is
                # split off below): validation's asserts would be ~30 ops a column.
                return tf.RaggedTensor.from_uniform_row_length(rows, size, validate=False)
            return reshape(rows)

        if not self.short_tail:
            return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(batched, element)).skip(drop)
        # Only the stream's last window ends in a short batch: its `tail` rows follow its
        # whole batches' (other windows have no tail). A dense column of any rank is split
        # into the two by one op (slices would take two, and begin and size vectors per
        # rank), its axis a shared constant (tf.split would make one per call); a ragged
        # column's values are split so, and its row splits cut in two (_ragged_split).
        columns = tf.nest.flatten(element)
        n = _row_count(columns)
        tail = n % batch
        whole = n - tail
        splits, axis = tf.concat([whole, tail], 0), tf.constant(0)
        parts = [
            _ragged_split(x, whole, tail, n, axis) if isinstance(x, tf.RaggedTensor) else tf.split(x, splits, axis=axis)
            for x in columns
        ]
        heads = [batched(p[0]) for p in parts]
        ds = tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(element, heads))
        if not keep_short:
            return ds.skip(drop)
        # Slices of none or one short batch: [count, tail] rows, count 0 when tail is 0
        # (and the split's tail empty).
        count = tf.minimum(tail, 1)
        short = _reshaper(tf.concat([count, tail], 0))
        ragged = any(isinstance(x, tf.RaggedTensor) for x in columns)
        tail_rows, count_rows = (tf.reshape(v, []) for v in (tail, count)) if ragged else (None, None)
        tails = [
            tf.RaggedTensor.from_uniform_row_length(p[1], tail_rows, nrows=count_rows, validate=False)
            if isinstance(x, tf.RaggedTensor)
            else short(p[1])
            for x, p in zip(columns, parts)
        ]
        ds = ds.concatenate(tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(element, tails)))
        return ds.skip(drop)


def _keep(state, element):
    """The scan's step: the state keeps the first pass and seed it saw (restored ones stay)."""
    seed, saved_fingerprint, kept_pass = state
    this_pass, w, drop, element_seed = element
    first = kept_pass < 0
    state = (tf.where(first, element_seed, seed), saved_fingerprint, tf.where(first, this_pass, kept_pass))
    return state, state + (w, drop)


def seekable(req: Request) -> bool:
    """Whether this request reads blocks in the seekable order (else the streaming block pipeline)."""
    return (
        req.options.seekable_order
        and req.info.layout == "blocks"
        and req.service is None
        and req.info.compression != "gzip"  # byte offsets of gzip members are not record offsets
        and not req.skip_corrupt
    )
