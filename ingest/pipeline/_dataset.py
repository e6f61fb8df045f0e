"""`make_dataset`: a tuned tf.data graph over a converted dataset, built in stages.

    request (every argument checked, defaults resolved: _request)
      -> read: shard files -> serialized records, checked against the metadata (_read)
      -> [cache: serialized records, before any random work]
      -> rows layout: [shuffle] -> [repeat]
             -> parse 1024 records at a time, rebatch to batch_size; or decode and augment images (_parse)
         blocks layout: [block shuffle] -> [repeat] -> parse windows of blocks
             -> [permute their rows] -> rebatch to batch_size (blocks.streaming)
         blocks layout cached in memory: parse all once -> cache columns -> per epoch a
             permutation of every row -> rebatch (blocks.column_cache)
      -> finish: [preprocess, parallel] -> [tf.data service] -> prefetch(AUTOTUNE)

Each stage reads only the request (and the read plan of this input pipeline). Caching
serialized rows keeps the cache the size of the data on disk; cached block columns are
parsed once and shuffled globally; the sizing decisions
(cycle length, buffers, whether to cache) are pure functions in _tuning.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from ingest.pipeline import _parse, _read, _request, _restore, _service, _tuning
from ingest.pipeline._functions import own_functions
from ingest.pipeline._options import ImageOptions, ReadOptions
from ingest.pipeline._request import Request
from ingest.pipeline._system import physical_memory
from ingest.pipeline.blocks import canonical
from ingest.pipeline.blocks import index as block_index
from ingest.pipeline.blocks import seekable as seekable_order
from ingest.pipeline.blocks.column_cache import cached_column_batches, columns_bytes
from ingest.pipeline.blocks.streaming import block_batches

__all__ = ["make_dataset", "read_records"]

logger = logging.getLogger(__name__)


def make_dataset(
    path,
    *,
    batch_size: int,
    split: str = "train",
    features=None,
    label=None,
    label_ids: bool = True,
    shuffle: bool = True,
    seed: int | None = None,
    num_epochs: int | None = 1,
    start_batch=None,
    cache=None,
    preprocess=None,
    drop_remainder: bool = False,
    deterministic: bool | None = None,
    options: ReadOptions | None = None,
    input_context: tf.distribute.InputContext | None = None,
    skip_corrupt: bool = False,
    static_shapes: bool = False,
    pad_lengths: dict | None = None,
    service: str | None = None,
    processing_mode: str = "distributed_epoch",
    image: ImageOptions | None = None,
    image_size=None,
    training: bool | None = None,
    channels: int | None = None,
    image_dtype: str | None = None,
    normalize="default",
    text: str = "strings",
    missing: str = "mask",
) -> tf.data.Dataset:
    """Builds a tuned `tf.data.Dataset` of batches from a converted dataset.

    Yields dicts of feature tensors, or `(features, label)` when there is a label (the
    dataset records one, or `label` names one). Image datasets yield `(images, labels)`.
    Every argument is checked before the graph is built; a wrong one raises ValueError
    saying what was given and what is valid.

    Source:
        path: the dataset directory `beam_jobs.convert` wrote, local or `gs://`; or
            several read as one (spans of daily data): a list of them, a glob
            (`"gs://b/flights/2026-11-*"`), or `ingest.spans(root, last=N)`. Their
            features must agree; every row of every span comes once per epoch, shuffled
            across spans.
        split: which split to read ("train", "validation", ...).
        features: names of the features to read; None reads them all. On an image
            dataset, naming features reads them raw, without decoding.
        label: the feature yielded apart, as `(features, label)`. None: the label the
            dataset records, if any; False: none (the label stays inside the dict).
        label_ids: a text label whose classes the conversion recorded
            (`load_info(path).labels`, sorted) is yielded as its class's index, an int64
            that `sparse_categorical_crossentropy` takes; False yields the text.
        pad_lengths: {feature: length} for variable-length features to pad (or truncate)
            into dense tensors; the others come as `tf.RaggedTensor`.
        text: "strings" (the default) yields text features as `tf.string`; "ids" yields
            each as int64 ids of the vocabulary the conversion recorded
            (`load_info(path).vocabulary(name)`: value `vocabulary[i - 1]` has id `i`, 0 is
            out of vocabulary, as Keras `StringLookup` numbers them), which an `Embedding`
            takes as they come. No string is made: the blocks store each value's id, and
            over spans converted with `--schema_from` a value's id never changes. The label
            comes apart as `label_ids` says (its class id, or its text); a text label kept
            among the features (`label=False`) has classes, no vocabulary: it is refused.
        missing: "mask" (the default): beside each feature whose records lack values
            somewhere (the metadata counts them), a `tf.bool` feature named NAME +
            "_missing", True at those rows, where NAME holds its default (0, 0.0, "", an
            empty list; with `text="ids"`, the default's id). The label's mask, if it has one, stays
            among the features. "fill": the default alone, as ingest gave before.
        static_shapes: every tensor gets a fully known shape: variable-length features
            are padded to `pad_lengths` or their recorded maximum. Needs
            `drop_remainder=True`.

    Batching:
        batch_size: records per batch (per input pipeline, with `input_context`).
        drop_remainder: drop the last, smaller batch of each pass.
        num_epochs: passes over the split; None repeats forever. Shuffling, parsing and
            batching run across epoch boundaries.
        preprocess: a function applied to each batch (in parallel, after parsing), such
            as a Keras preprocessing model; it sees what the dataset would yield.

    Shuffling:
        shuffle: shuffle the order of shard files each epoch, then records through a
            buffer (`ReadOptions.shuffle_buffer`; ~16 MB worth by default: conversion
            already shuffled records across shards). On the blocks layout: shard order,
            then blocks through a buffer (`ReadOptions.block_shuffle_buffer`), then the
            rows of each window of blocks (`ReadOptions.block_window`, >= 65,536 rows or
            the split) are permuted together. In the seekable order (the default) an
            epoch permutes runs of consecutive blocks (`ReadOptions.block_run`, 4,096
            rows), in windows of >= 81,920 rows.
        seed: makes shuffling and image augmentation reproducible.
        start_batch: start each new iterator at this batch of the stream instead of the
            first: an int, or a scalar integer `tf.Variable` read when the iterator makes
            its first batch, so not a counter that the step taking it adds to (in `fit`,
            `ingest.FitStart().step`, not `optimizer.iterations`). It seeks: earlier
            windows are not read. Needs a `seed` (the order must be the one the stream
            started in) and the blocks layout's seekable order. With finite `num_epochs`
            the stream ends where it would have (an int start leaves the remaining
            batches as the cardinality; a variable's, read later, leaves it unknown).
        deterministic: deliver elements in a fixed order. None: exactly when a `seed` is
            given (out-of-order delivery is faster).

    Images (datasets converted with `--source images`):
        image: an `ingest.ImageOptions`: output size, training or evaluation transform,
            channels, dtype and normalization. Or give the same as the keywords below,
            not both.
        image_size: (height, width) of the images yielded; needed to decode an image
            dataset (or `image=`, or `features=[...]` for the raw records).
        training: True takes a random resized crop (for JPEGs only the crop is decoded)
            and a random flip, set by `ImageOptions` (`crop_area`, `crop_aspect`, `flip`,
            `crop_small`); False the central crop, the same pixels every pass. None (the
            default): True only for the "train" split read with `shuffle=True`, so an
            eval split or an unshuffled read is never augmented unless asked.
        channels: 3 (the default, RGB) or 1 (grayscale).
        image_dtype: "float32" (the default), "bfloat16" or "uint8".
        normalize: None (0-255), "unit" ([0, 1]), "imagenet" or (mean, std) per channel
            in [0, 1] units. "default": "unit" for floats, None for uint8.

    Performance:
        cache: None; "memory"; "auto" (memory when what this pipeline reads fits
            `ReadOptions.cache_budget_bytes`, a quarter of RAM by default); or a local file
            path. On the rows layout (and in a file) the cache holds serialized records,
            taken before any shuffle, so later epochs skip reading but still shuffle. On
            the blocks layout in memory it holds the parsed columns (their size is what
            "auto" checks): later epochs skip reading and parsing, and with `shuffle` each
            epoch is a permutation of every cached row, a global shuffle.
        options: an `ingest.ReadOptions` with tuning knobs (interleave width, parallelism,
            buffer sizes, autotune budgets, symbolic checkpoints); every one defaults to
            automatic.

    Distribution and tf.data service:
        input_context: the `tf.distribute.InputContext` of a
            `distribute_datasets_from_function` call: each input pipeline reads its own
            shard files (or, with fewer files than pipelines, its own records).
        service: "grpc://host:port" of a tf.data service dispatcher (`python -m ingest
            service ...`): the pipeline runs on the service's workers. When no batch
            arrives for `ReadOptions.service_timeout_s` (60 s by default), iteration raises
            an error naming the dispatcher and saying a worker was most likely lost,
            instead of waiting forever. Records are delivered at most once: those a lost
            worker held are lost.
        processing_mode: "distributed_epoch" splits the shards among the workers (a stall
            after every record arrived ends the epoch normally); "parallel_epochs" gives
            each worker every record.

    Fault tolerance:
        skip_corrupt: a malformed metadata file, an empty split or a missing shard file is
            refused before the graph is built, naming the file or split; a shard that is
            corrupt, truncated, deleted while reading or holds fewer records than its
            metadata raises an error naming it. With True, the records such shards lose
            (missing shards included) are skipped, logged and counted in
            `ingest.skipped_corrupt_records()`, and images that fail to decode are skipped.
            A shard holding more records than its metadata says always raises, before any
            extra record is delivered. On the blocks layout shards are checked in blocks
            and losses counted in rows.

    Returns:
        A `tf.data.Dataset` with its cardinality set when it is known (finite epochs, no
        skipping, no service, no `start_batch` variable), prefetching, with tuned
        `tf.data.Options`.
    """
    req = _request.build(
        path,
        split=split,
        options=options,
        batch_size=batch_size,
        features=features,
        label=label,
        label_ids=label_ids,
        pad_lengths=pad_lengths,
        static_shapes=static_shapes,
        drop_remainder=drop_remainder,
        num_epochs=num_epochs,
        preprocess=preprocess,
        shuffle=shuffle,
        seed=seed,
        deterministic=deterministic,
        cache=cache,
        skip_corrupt=skip_corrupt,
        start_batch=start_batch,
        text=text,
        missing=missing,
        image=_request.image_options(
            image,
            image_size=image_size,
            training=training,
            channels=channels,
            image_dtype=image_dtype,
            normalize=normalize,
        ),
        num_pipelines=input_context.num_input_pipelines if input_context else 1,
        pipeline_id=input_context.input_pipeline_id if input_context else 0,
        service=service,
        processing_mode=processing_mode,
    )
    with own_functions():
        return _dataset_of(req)


def _dataset_of(req: Request) -> tf.data.Dataset:
    """The request's pipeline, its functions traced inside `own_functions()` (all but the user's)."""
    plan = _read.shard_plan(req)
    if plan.record_shard is not None:
        logger.warning(
            "%s has %d shard file(s) for %d input pipelines: sharding by record instead of by file "
            "(every pipeline reads every file). Reconvert with --num_shards >= %d for file-level sharding.",
            req.path,
            len(plan.files),
            req.num_pipelines,
            req.num_pipelines,
        )
    target = _cache_target(req, plan)
    seeks = target is None and seekable_order.seekable(req)
    for asked, what in (
        (req.start_batch, "start_batch"),
        (req.options.canonical_pipelines, "ReadOptions.canonical_pipelines"),
    ):
        if asked is not None and not seeks:
            raise ValueError(
                f"{what} needs the blocks layout's seekable order: a dataset in the blocks layout, no cache, "
                "skip_corrupt or service, and ReadOptions(seekable_order=True) (the default)"
            )
    if seeks:
        content = str(req.info.source.get("job", ""))
        if req.options.canonical_pipelines is not None:
            # Canonical partitions deal the whole split's blocks: every shard's offsets.
            index = block_index.index_split(req.path, req.split, req.info.block_rows, content=content)
            ds, rows = canonical.canonical_batches(req, index)
            return _finished(ds, req, rows, seekable=True)
        # Only this pipeline's shards are opened for their offsets (all, with fewer shards than pipelines).
        index = block_index.pipeline_index(
            req.path,
            req.split,
            req.info.block_rows,
            content=content,
            num_pipelines=req.num_pipelines,
            pipeline_id=req.pipeline_id,
        )
        if req.options.symbolic_checkpoint:
            ds, resume = seekable_order.seekable_block_batches(req, index), None
        else:
            # Iterators checkpoint their position (ingest.pipeline._restore): tf.data's symbolic
            # checkpoints cost a third to a half of the rate (BENCHMARKS.md, #45).
            ds, resume = seekable_order.positioned_block_batches(req, index)
        return _finished(ds, req, int(index.rows.sum()), seekable=True, resume=resume)
    column_cache = target == "memory" and req.info.layout == "blocks" and req.service is None
    # Blocks come located (shard, position, rows by the metadata) for the window parse to
    # check; not when skipping corrupt records (a skipped block shifts the positions after
    # it: the reader checks those itself) nor into the column cache, which parses them itself.
    located = req.info.layout == "blocks" and not req.skip_corrupt and not column_cache
    ds = _read.records(req, plan, located=located)
    if req.checks_counts:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.records))
    if column_cache:
        ds = cached_column_batches(ds, req, plan)
    else:
        if target is not None:
            ds = ds.cache() if target == "memory" else ds.cache(target)
        ds = _BATCHES[req.info.layout](ds, req, plan)
    return _finished(ds, req, plan.total_rows)


def _records_bytes(req: Request, plan: _tuning.FileShards) -> float:
    """The pipeline's share of the split's bytes, from the recorded average record size."""
    return req.split.bytes * plan.records / max(req.split.tfrecords, 1)


def _row_batches(ds: tf.data.Dataset, req: Request, plan: _tuning.FileShards) -> tf.data.Dataset:
    """Rows layout: records -> [shuffle buffer] -> [repeat] -> parsed batches, or decoded images."""
    records_bytes = _records_bytes(req, plan)
    if req.shuffle:
        buffer = _tuning.shuffle_buffer(
            plan.records,
            records_bytes / max(plan.records, 1),
            batch_size=req.batch_size,
            requested=req.options.shuffle_buffer,
        )
        ds = ds.shuffle(max(buffer, 1), seed=req.seed, reshuffle_each_iteration=True)
    if req.num_epochs != 1:
        ds = ds.repeat(req.num_epochs)
    return _parse.decoded_images(ds, req) if req.image is not None else _parse.parsed_batches(ds, req)


# What follows the read (and the cache) in each record layout (contract.LAYOUTS).
_BATCHES = {"rows": _row_batches, "blocks": block_batches}


def read_records(path, *, split: str = "train", options: ReadOptions | None = None) -> tf.data.Dataset:
    """The read stage alone (shards -> serialized records, no shuffle); for diagnosis.

    On the blocks layout each record is a block of up to `load_info(path).block_rows`
    rows (docs/block_format.md): count rows with the metadata, not records.
    """
    req = _request.build(path, split=split, options=options, raw=True)
    with own_functions():  # as make_dataset's read stage is built
        return _read.records(req, _read.shard_plan(req)).with_options(_tf_options(req))


def _cache_target(req: Request, plan: _tuning.FileShards) -> str | None:
    """None, "memory" or a file path: what `cache` asks for, with "auto" decided by size.

    The blocks layout caches parsed columns in memory (blocks.column_cache): their size, not
    the serialized bytes, is checked against the budget.
    """
    budget = _tuning.cache_budget(physical_memory(), requested=req.options.cache_budget_bytes)
    size = _records_bytes(req, plan)
    if req.info.layout == "blocks" and req.service is None:
        rows = plan.total_rows if plan.total_rows is not None else req.split.records / req.num_pipelines
        size = columns_bytes(_parse.selected_features(req), int(rows), size)
    target = _tuning.cache_target(req.cache, records_bytes=int(size), budget_bytes=budget)
    if target is None and req.cache == "auto":
        logger.info("cache='auto': %.0f MB does not fit the %.0f MB budget; not caching", size / 2**20, budget / 2**20)
    return target


def _finished(
    ds: tf.data.Dataset, req: Request, rows: int | None, *, seekable: bool = False, resume=None
) -> tf.data.Dataset:
    """Batches -> what the trainer iterates: counted, preprocessed, served, prefetched, tuned.

    `rows`: what this pipeline reads per epoch, when known. `seekable`: the seekable order's
    graph; with `resume` (an _restore.Resume) its iterators checkpoint their position.
    """
    if req.preprocess is not None and req.deterministic is False:
        resume = None  # batches out of order: a count of them is no position
    # A start_batch read from a variable is known only when an iterator is made: the
    # count of what remains is then unknown to the graph.
    static_start = req.start_batch is None or isinstance(req.start_batch, int)
    counted = ds
    if req.num_epochs is not None and req.checks_counts and rows is not None and static_start:
        total = rows * req.num_epochs
        batches = _tuning.batches(total, req.batch_size, drop_remainder=req.drop_remainder)
        counted = ds.apply(tf.data.experimental.assert_cardinality(max(batches - (req.start_batch or 0), 0)))
    done = _served(counted, req, rows, seekable=seekable, resume=resume)
    if not seekable:
        return done
    # The seekable order checks a restored checkpoint: its iterators say why one is refused
    # in a line. A restored iterator resumes mid-stream, where the count would fail: it is
    # made over the same stages without it.
    return _restore.restorable(done, resume, restart=lambda: _served(ds, req, rows, seekable=True, resume=resume))


def _served(ds: tf.data.Dataset, req: Request, rows: int | None, *, seekable: bool, resume) -> tf.data.Dataset:
    """_finished's stages after the count: preprocessed, served, prefetched, tuned."""
    opts = req.options
    if req.preprocess is not None:
        with own_functions(False):  # the user's function may use resources on any device
            ds = ds.map(
                req.preprocess,
                num_parallel_calls=opts.num_parallel_calls or tf.data.AUTOTUNE,
                deterministic=req.deterministic,
            )
    if req.service is not None:
        # Everything above runs on the service's workers; the client only receives batches.
        ds = ds.with_options(_tf_options(req))
        ds = ds.apply(tf.data.experimental.service.distribute(processing_mode=req.processing_mode, service=req.service))
        timeout = opts.service_timeout_s if opts.service_timeout_s is not None else _service.DEFAULT_TIMEOUT_S
        # Each record comes once, in batches of the records given: a stall after the last one is harmless.
        whole = (
            req.processing_mode == "distributed_epoch"
            and req.num_epochs
            and req.preprocess is None
            and not req.skip_corrupt
        )
        ds = _service.guard_stalls(
            ds,
            dispatcher=req.service,
            timeout_s=timeout,
            expected_records=rows * req.num_epochs if whole and rows is not None else None,
        )
    ds = ds.prefetch(opts.prefetch if opts.prefetch is not None else tf.data.AUTOTUNE)
    return ds.with_options(_tf_options(req, seekable=seekable, symbolic=seekable and resume is None))


def _tf_options(req: Request, *, seekable: bool = False, symbolic: bool = False) -> tf.data.Options:
    opts = req.options
    o = tf.data.Options()
    # Determinism is set on each op (interleave, maps); a global Options.deterministic
    # measured slower here (TF 2.21).
    o.autotune.enabled = opts.autotune
    if opts.ram_budget_bytes is not None:
        o.autotune.ram_budget = opts.ram_budget_bytes
    if opts.cpu_budget is not None:
        o.autotune.cpu_budget = opts.cpu_budget
    if seekable:
        # The seekable order sets every stage's parallelism and buffer itself: tf.data's
        # static rewrites find nothing to change, and running them cost 15 of the 46 ms a
        # new iterator took (the graph is serialized, rewritten and rebuilt per iterator).
        o.experimental_optimization.apply_default_optimizations = False
        o.experimental_optimization.inject_prefetch = False
    else:
        o.experimental_optimization.map_parallelization = True
        o.experimental_optimization.parallel_batch = True
    if opts.private_threadpool_size is not None:
        o.threading.private_threadpool_size = opts.private_threadpool_size
    if opts.max_intra_op_parallelism is not None:
        o.threading.max_intra_op_parallelism = opts.max_intra_op_parallelism
    # `symbolic`: a seekable graph whose iterators do not checkpoint their position
    # (canonical partitions, or symbolic_checkpoint=True) checkpoints symbolically unless
    # the options turn it off; any other graph only when they turn it on.
    asked = opts.symbolic_checkpoint
    o.experimental_symbolic_checkpoint = bool(asked) or (symbolic and asked is None)
    # The shard check's py_function touches no state a checkpoint would need.
    o.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    if req.sharded:
        # Files are already split between input pipelines; tf.distribute must not re-shard.
        o.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return o
