"""`make_dataset`: a tuned tf.data graph over a converted dataset.

    shard list (shuffled per epoch) -> [file-level sharding by input pipeline]
      -> parallel interleave of TFRecordDataset blocks (large read buffer, AUTOTUNE)
      -> unbatch
      -> [record-level sharding, when files < input pipelines] -> assert_cardinality
      -> [cache: serialized records, before any random work]
      -> shuffle -> repeat -> batch into parse blocks -> parse_example on whole blocks
      -> rebatch to batch_size -> [preprocess, parallel] -> prefetch(AUTOTUNE)

Parsing whole blocks is several times cheaper than per-record parsing (and 1.3-1.5x
cheaper than per-256-record batches), which is why batching comes before parsing;
caching serialized records keeps the cache the size of the data on disk.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import uuid

import tensorflow as tf

from ingest import _images, _plan, _service, contract
from ingest._info import load_info
from ingest._options import PipelineOptions

__all__ = ["make_dataset", "skipped_corrupt_records"]

logger = logging.getLogger(__name__)

_TF_DTYPES = {"int64": tf.int64, "float32": tf.float32, "bytes": tf.string}
_CACHE_MODES = (None, "memory", "auto")
_skipped_lock = threading.Lock()
_skipped: dict = {}


def skipped_corrupt_records() -> dict:
    """Records lost to corruption in this process, per shard path (with `skip_corrupt=True`)."""
    with _skipped_lock:
        return dict(_skipped)


@dataclasses.dataclass(frozen=True)
class _Request:
    """Validated arguments of one make_dataset call."""

    info: contract.DatasetInfo
    path: str
    split: contract.SplitInfo
    features: tuple
    label: str | None
    batch_size: int
    num_epochs: int | None
    cache: str | None
    deterministic: bool
    seed: int | None
    static_shapes: bool
    pad_lengths: dict
    image: _images.ImageSpec | None = None  # decode and augment the dataset's images
    service: str | None = None  # a tf.data service dispatcher, "grpc://host:port"
    processing_mode: str = "distributed_epoch"


def _validate(path, *, batch_size, split, features, label, num_epochs, cache, preprocess,
              drop_remainder, deterministic, seed, static_shapes, pad_lengths, options,
              skip_corrupt, image_args=None, service=None, processing_mode="distributed_epoch") -> _Request:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1):
        raise ValueError(f"num_epochs must be a positive integer or None (repeat forever), got {num_epochs!r}")
    if preprocess is not None and not callable(preprocess):
        raise ValueError(f"preprocess must be a callable or None, got {preprocess!r}")
    if deterministic not in (None, True, False):
        raise ValueError(f"deterministic must be True, False or None, got {deterministic!r}")
    if options is not None and not isinstance(options, PipelineOptions):
        raise ValueError(f"options must be an ingest.PipelineOptions, got {type(options).__name__}")
    if skip_corrupt and options is not None and options.symbolic_checkpoint:
        raise ValueError(
            "skip_corrupt=True needs tf.data's ignore_errors, which symbolic checkpointing does not "
            "support: use PipelineOptions(symbolic_checkpoint=False) or skip_corrupt=False"
        )
    if service is not None:
        if not isinstance(service, str) or not service.strip():
            raise ValueError(f"service must be a dispatcher address like 'grpc://host:5050', got {service!r}")
        service = service if "://" in service else "grpc://" + service
        if processing_mode not in _service.PROCESSING_MODES:
            raise ValueError(f"processing_mode must be one of {_service.PROCESSING_MODES}, got {processing_mode!r}")
    if static_shapes and not drop_remainder:
        raise ValueError("static_shapes=True needs drop_remainder=True, so that the batch dimension is fixed")
    info = load_info(path)
    try:
        split_info = info.split(split)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    if split_info.records == 0:
        others = [f"{s.name} ({s.records} records)" for s in info.splits if s.records]
        raise ValueError(
            f"split {split!r} of {path} has no records: the conversion wrote no shard for it (see "
            f"{contract.METADATA_FILENAME}). Splits with records: {', '.join(others) or 'none'}"
        )
    _check_shards_exist(str(path).rstrip("/"), split_info, skip_corrupt=skip_corrupt)
    names = [f.name for f in info.features]
    if label is None:
        label = info.label
    elif label is False:
        label = None
    elif label not in names:
        raise ValueError(f"label {label!r} is not a feature of {path}; features: {names}")
    image = _image_request(info, path, features, image_args)
    if image is not None:
        selected = [info.image["feature"]] + ([label] if label is not None else [])
    elif features is None:
        selected = list(names)
    else:
        selected = list(features)
        unknown = [f for f in selected if f not in names]
        if unknown:
            raise ValueError(f"features {unknown} do not exist in {path}; features: {names}")
        if label is not None and label not in selected:
            selected.append(label)
    pad_lengths = dict(pad_lengths or {})
    for name in pad_lengths:
        if name not in names:
            raise ValueError(f"pad_lengths names {name!r}, which is not a feature; features: {names}")
    if static_shapes:
        for f in info.features:
            if f.name in selected and f.is_variable_length and f.name not in pad_lengths and f.max_length is None:
                raise ValueError(
                    f"feature {f.name!r} has variable length and no recorded maximum: give "
                    f"pad_lengths={{{f.name!r}: N}} to use static_shapes=True"
                )
    if cache not in _CACHE_MODES:
        if not isinstance(cache, (str, os.PathLike)):
            raise ValueError(f"cache must be None, 'memory', 'auto' or a file path, got {cache!r}")
        cache = os.fspath(cache)
        _check_writable(cache)
    if deterministic is None:
        # Out-of-order delivery is faster; a seed asks for reproducibility.
        deterministic = seed is not None
    return _Request(
        info=info, path=str(path).rstrip("/"), split=split_info, features=tuple(selected),
        label=label, batch_size=batch_size, num_epochs=num_epochs, cache=cache,
        deterministic=deterministic, seed=seed, static_shapes=bool(static_shapes),
        pad_lengths=pad_lengths, image=image, service=service, processing_mode=processing_mode,
    )


def _check_shards_exist(path: str, split: contract.SplitInfo, *, skip_corrupt: bool) -> None:
    """Refuses (or, with skip_corrupt, announces) shard files that are gone, with one listing."""
    try:
        present = set(tf.io.gfile.listdir(path))
    except tf.errors.OpError as e:
        logger.debug("cannot list %s (%s); missing shards will be reported as they are read", path, e.message)
        return
    missing = [s for s in split.shards if s.filename not in present
               and ("/" not in s.filename or not tf.io.gfile.exists(f"{path}/{s.filename}"))]
    if not missing:
        return
    names = ", ".join(f"{path}/{s.filename} ({s.records} records)" for s in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    lost = sum(s.records for s in missing)
    if skip_corrupt:
        logger.warning("%d shard file(s) of split %r are missing: %s%s; their %d record(s) will be skipped "
                       "(and counted in skipped_corrupt_records())", len(missing), split.name, names, more, lost)
        return
    raise FileNotFoundError(
        f"{len(missing)} shard file(s) of split {split.name!r} listed in {path}/{contract.METADATA_FILENAME} "
        f"are missing: {names}{more}. Restore them or reconvert the dataset, or pass skip_corrupt=True to "
        f"skip their {lost} record(s)."
    )


def _image_request(info, path, features, image_args):
    if image_args is None:
        return None  # raw records asked for (read_records, diagnose)
    image_size = image_args.get("image_size")
    if not info.image:
        if image_size is not None:
            raise ValueError(f"image_size is for image datasets; {path} holds no images (features: {[f.name for f in info.features]})")
        return None
    if features is not None:
        return None  # raw features asked for by name: no decoding
    if image_size is None:
        raise ValueError(
            f"{path} is an image dataset: give image_size=(height, width) to decode and augment its images "
            "(training=True|False), or features=[...] to read raw features"
        )
    return _images.make_image_spec(**image_args)


def _check_writable(cache_path: str) -> None:
    parent = os.path.dirname(cache_path) or "."
    probe = os.path.join(parent, f".ingest-cache-probe-{uuid.uuid4().hex}")
    try:
        if not tf.io.gfile.isdir(parent):
            raise ValueError(f"cache directory {parent} does not exist; create it or pass another cache path")
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("")
        tf.io.gfile.remove(probe)
    except tf.errors.OpError as e:
        raise ValueError(f"cache path {cache_path} is not writable: {e.message}") from e


def _parse_spec(f: contract.FeatureSpec):
    dtype = _TF_DTYPES[f.dtype]
    default = f.default.encode() if f.dtype == "bytes" and isinstance(f.default, str) else f.default
    if f.is_scalar:
        return tf.io.FixedLenFeature([], dtype, default_value=default if f.missing else None)
    if not f.is_variable_length:
        (k,) = f.shape
        return tf.io.FixedLenFeature([k], dtype, default_value=[default] * k if f.missing else None)
    return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)


def _make_parser(req: _Request):
    specs = {}
    pad = {}
    for f in req.info.features:
        if f.name not in req.features:
            continue
        specs[f.name] = _parse_spec(f)
        if f.is_variable_length and (f.name in req.pad_lengths or req.static_shapes):
            length = req.pad_lengths.get(f.name, f.max_length)
            pad[f.name] = (int(length), f.default.encode() if f.dtype == "bytes" else f.default)
    label = req.label

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, specs)
        for name, (length, default) in pad.items():
            # Pads short rows and truncates long ones to a fixed length.
            parsed[name] = parsed[name].to_tensor(default_value=default, shape=[None, length])
        return parsed

    def split_label(parsed):
        parsed = dict(parsed)
        y = parsed.pop(label)
        return parsed, y

    return parse, (split_label if label is not None else None)


def _tf_options(req: _Request, opts: PipelineOptions, *, sharded: bool) -> tf.data.Options:
    o = tf.data.Options()
    # Determinism is set on each op (interleave, maps); a global Options.deterministic
    # measured slower here (TF 2.21).
    o.autotune.enabled = True
    if opts.ram_budget_bytes is not None:
        o.autotune.ram_budget = opts.ram_budget_bytes
    if opts.cpu_budget is not None:
        o.autotune.cpu_budget = opts.cpu_budget
    o.experimental_optimization.map_parallelization = True
    o.experimental_optimization.parallel_batch = True
    if opts.private_threadpool_size is not None:
        o.threading.private_threadpool_size = opts.private_threadpool_size
    if opts.max_intra_op_parallelism is not None:
        o.threading.max_intra_op_parallelism = opts.max_intra_op_parallelism
    o.experimental_symbolic_checkpoint = opts.symbolic_checkpoint
    # The shard check's py_function touches no state a checkpoint would need.
    o.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    if sharded:
        # Files are already split between input pipelines; tf.distribute must not re-shard.
        o.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return o


_COUNT_BLOCK = 64  # records per block read from a shard: amortizes the checks and the interleave

_SHARD_FIX = "Reconvert the dataset, or pass skip_corrupt=True to skip the rest of a bad shard."
_MISSING_FIX = "Restore the file or reconvert the dataset, or pass skip_corrupt=True to skip its records."
_DISAGREE_FIX = (
    f"The metadata and the shard disagree: the shard was replaced or appended to after conversion, or "
    f"{contract.METADATA_FILENAME} comes from another conversion. Reconvert the dataset."
)


def _shard_problem(name: str, expected: int, read: int) -> tuple:
    """(what is wrong, what to do) for a shard that did not yield the records its metadata lists."""
    if read > expected:
        return (f"shard {name} holds more records than its metadata says: read {read} (at least), "
                f"{contract.METADATA_FILENAME} lists {expected}", _DISAGREE_FIX)
    if read == 0 and not _exists(name):
        return (f"shard {name} is missing: {contract.METADATA_FILENAME} lists it with {expected} records, "
                "but the file does not exist (deleted or moved after conversion?)", _MISSING_FIX)
    return (f"shard {name} is corrupt, truncated or unreadable: read {read} of {expected} records "
            "(the underlying error is logged above)", _SHARD_FIX)


def _exists(name: str) -> bool:
    try:
        return tf.io.gfile.exists(name)
    except tf.errors.OpError:  # unreadable (permissions, network): not known to be missing
        return True


def _note_skipped(filename, expected, read):  # runs inside tf.data, through py_function
    name = filename.numpy().decode("utf-8", "replace")
    expected, read = int(expected.numpy()), int(read.numpy())
    problem, fix = _shard_problem(name, expected, read)
    if read > expected:
        # Not corruption that skipping can repair: which records are the right ones is unknown.
        raise tf.errors.DataLossError(None, None, f"{problem}. {fix} (skip_corrupt=True does not apply: "
                                      "no record is corrupt, and which ones belong is unknown)")
    with _skipped_lock:
        _skipped[name] = _skipped.get(name, 0) + expected - read
    logger.warning("skipped %d record(s): %s", expected - read, problem)
    return expected - read


def _shard_error(filename, expected, read):  # runs inside tf.data, through py_function
    name = filename.numpy().decode("utf-8", "replace")
    problem, fix = _shard_problem(name, expected=int(expected.numpy()), read=int(read.numpy()))
    raise tf.errors.DataLossError(None, None, f"{problem}. {fix}")


def _exists_in_graph(filename):
    # matching_files takes a pattern: escape glob characters so the path matches only itself.
    return tf.size(tf.io.matching_files(tf.strings.regex_replace(filename, r"([*?\[\]\\])", r"\\\1"))) > 0


def _reader(req: _Request, opts: PipelineOptions, skip_corrupt: bool):
    """Reads one shard as blocks of records; checks it yields what the metadata promises.

    TFRecordDataset stops a file at its first corrupt or truncated record with an error
    that does not name the file. Here errors end the file quietly, and the count decides:
    a shortfall at the end raises an error naming the shard, or, with `skip_corrupt`, is
    logged and counted; a record beyond the count raises before it is delivered.

    A missing file must not reach TFRecordDataset under ignore_errors: it advances past
    read errors but not past a failed open, so ignore_errors would retry the open forever
    (100% CPU, a warning per try). So each shard is looked up as it enters the interleave,
    just before its open, and a missing one is read as no files: the count then reports
    it. A file deleted in the instant between lookup and open would still spin; bounding
    the retries in-graph (zip with a counter) costs every record a zip, 15-20% end to end
    on 11 small features, so it is not done.
    """
    compression = "GZIP" if req.info.compression == "gzip" else ""
    buffer = _plan.read_buffer_bytes(remote=_plan.is_remote(req.path), requested=opts.read_buffer_bytes)
    on_problem = _note_skipped if skip_corrupt else _shard_error

    def open_shard(filenames):
        return tf.data.TFRecordDataset(filenames, compression_type=compression, buffer_size=buffer)

    def checked_in_graph(filename, expected, total):
        # tf.data service workers run the graph in another process: no py_function there.
        missing = tf.logical_and(tf.equal(total, 0), tf.logical_not(_exists_in_graph(filename)))
        n, read = tf.strings.as_string(expected), tf.strings.as_string(total)
        problem = tf.where(
            missing,
            tf.strings.join(["shard ", filename, f" is missing: {contract.METADATA_FILENAME} lists it with ", n,
                             " records, but the file does not exist"]),
            tf.strings.join(["shard ", filename, " is corrupt, truncated or unreadable: read ", read, " of ", n,
                             " records"]))
        if skip_corrupt:
            done = tf.print(tf.strings.join(["warning: skipped ", tf.strings.as_string(expected - total),
                                             " record(s): ", problem]))
        else:
            fix = tf.where(missing, _MISSING_FIX, _SHARD_FIX)
            done = tf.debugging.Assert(False, [tf.strings.join([problem, ". ", fix])])
        with tf.control_dependencies([done]):
            return tf.identity(expected - total)

    def too_many_in_graph(filename, expected, total):
        done = tf.debugging.Assert(False, [tf.strings.join([
            "shard ", filename, " holds more records than its metadata says: read ", tf.strings.as_string(total),
            f" (at least), {contract.METADATA_FILENAME} lists ", tf.strings.as_string(expected), ". ", _DISAGREE_FIX])])
        with tf.control_dependencies([done]):
            return tf.constant(0, tf.int64)

    def read(filename, expected):
        # Looked up as the shard enters the interleave: a missing file is opened as no files.
        present = tf.boolean_mask(tf.reshape(filename, [1]), tf.reshape(_exists_in_graph(filename), [1]))
        if opts.symbolic_checkpoint:
            # ignore_errors cannot be checkpointed symbolically: a corrupt record raises TF's
            # own error, unnamed; missing files and wrong counts are still caught below.
            blocks = open_shard(present).batch(_COUNT_BLOCK)
        else:
            blocks = open_shard(present).ignore_errors(log_warning=True).batch(_COUNT_BLOCK)
        end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))  # an empty block marks the end

        def running_count(total, block):
            size = tf.shape(block, out_type=tf.int64)[0]
            return total + size, (total + size, size, block)

        def check(total, size, block):
            short = tf.logical_and(tf.equal(size, 0), total < expected)
            if req.service:
                on_short = lambda: checked_in_graph(filename, expected, total)  # noqa: E731
                on_extra = lambda: too_many_in_graph(filename, expected, total)  # noqa: E731
            else:
                on_short = on_extra = lambda: tf.py_function(on_problem, [filename, expected, total], tf.int64)  # noqa: E731
            done = tf.case([(total > expected, on_extra), (short, on_short)], default=lambda: tf.constant(0, tf.int64))
            with tf.control_dependencies([done]):
                return tf.identity(block)

        # Blocks, not records: the interleave's per-element cost is paid once per block
        # (1.6x end-to-end throughput on the benchmark); the caller unbatches.
        return blocks.concatenate(end).scan(tf.constant(0, tf.int64), running_count).map(check)

    return read


def _shard_plan(req: _Request, *, num_pipelines: int = 1, pipeline_id: int = 0) -> _plan.FileShards:
    files = [f"{req.path}/{s.filename}" for s in req.split.shards]
    counts = [s.records for s in req.split.shards]
    return _plan.shard_files(files, counts, num_pipelines=num_pipelines, pipeline_id=pipeline_id)


def _records(req, opts, plan, *, shuffle, seed, skip_corrupt) -> tf.data.Dataset:
    """Serialized records of this pipeline's shards: the read stage of the graph."""
    ds = tf.data.Dataset.from_tensor_slices((list(plan.files), tf.constant(plan.counts, tf.int64)))
    if shuffle and plan.record_shard is None and len(plan.files) > 1:
        ds = ds.shuffle(len(plan.files), seed=seed, reshuffle_each_iteration=True)
    remote = _plan.is_remote(req.path)
    cycle = _plan.cycle_length(len(plan.files), remote=remote, cpu_count=os.cpu_count() or 1, requested=opts.cycle_length)
    ds = ds.interleave(
        _reader(req, opts, skip_corrupt),
        cycle_length=cycle,
        num_parallel_calls=_plan.interleave_parallelism(cycle, remote=remote, requested=opts.num_parallel_calls) or tf.data.AUTOTUNE,
        # Record-level sharding needs the same record order in every pipeline.
        deterministic=True if plan.record_shard is not None else req.deterministic,
    ).unbatch()
    if plan.record_shard is not None:
        ds = ds.shard(*plan.record_shard)
    return ds


def read_records(path, *, split: str = "train", options: PipelineOptions | None = None) -> tf.data.Dataset:
    """The read stage alone (shards -> serialized records, no shuffle); for diagnosis."""
    opts = options or PipelineOptions()
    req = _validate(path, batch_size=1, split=split, features=None, label=False, num_epochs=1, cache=None,
                    preprocess=None, drop_remainder=False, deterministic=False, seed=None, static_shapes=False,
                    pad_lengths=None, options=opts, skip_corrupt=False)
    ds = _records(req, opts, _shard_plan(req), shuffle=False, seed=None, skip_corrupt=False)
    return ds.with_options(_tf_options(req, opts, sharded=False))


def make_dataset(
    path,
    *,
    batch_size: int,
    split: str = "train",
    features=None,
    label=None,
    shuffle: bool = True,
    seed: int | None = None,
    num_epochs: int | None = 1,
    cache=None,
    preprocess=None,
    drop_remainder: bool = False,
    deterministic: bool | None = None,
    options: PipelineOptions | None = None,
    input_context: tf.distribute.InputContext | None = None,
    skip_corrupt: bool = False,
    static_shapes: bool = False,
    pad_lengths: dict | None = None,
    service: str | None = None,
    processing_mode: str = "distributed_epoch",
    image_size=None,
    training: bool = True,
    channels: int = 3,
    image_dtype: str = "float32",
    normalize="default",
) -> tf.data.Dataset:
    """Builds a tuned `tf.data.Dataset` of batches from a converted dataset.

    Yields dicts of feature tensors, or `(features, label)` when the dataset records a
    label or `label` names one (`label=False` keeps the label inside the dict).
    Variable-length features come as `tf.RaggedTensor`, or padded/truncated dense
    tensors for those in `pad_lengths` (and all of them with `static_shapes=True`).
    `deterministic=None` means deterministic exactly when a `seed` is given.
    `cache`: None, "memory", "auto" (memory when the split fits the budget) or a
    local file path; the cache holds serialized records, taken before any shuffle.

    Image datasets (converted with `--source images`) yield `(images, labels)` given
    `image_size=(H, W)`: `training=True` takes a random resized crop (for JPEGs with the
    fused decode_and_crop_jpeg: pixels outside the crop are never decoded) and a random
    flip; `training=False` a central crop. `channels` is 1 or 3; `image_dtype` uint8,
    float32 or bfloat16; `normalize` None (0-255), "unit" ([0, 1], the default for
    floats), "imagenet" or (mean, std) in [0, 1] units.

    `service="grpc://host:port"` runs the pipeline on a tf.data service cluster
    (`python -m ingest service ...`); `processing_mode` "distributed_epoch" splits the
    shards among its workers, "parallel_epochs" gives each worker every record. When no
    batch arrives for `PipelineOptions.service_timeout_s` (default 60 s), iteration raises
    an error naming the dispatcher and saying a worker was most likely lost, instead of
    waiting forever; with distributed_epoch, a stall after every record arrived ends the
    epoch normally. Records are delivered at most once: those a lost worker held are lost.

    Damaged datasets: a malformed metadata file, an empty split or a missing shard file
    is refused before the graph is built, naming the file or split. A shard that is
    corrupt, truncated, deleted while reading or holds fewer records than its metadata
    raises an error naming it; `skip_corrupt=True` instead skips and counts the records
    lost (`skipped_corrupt_records()`), missing shards included. A shard holding more
    records than its metadata says always raises, before any extra record is delivered.
    """
    opts = options or PipelineOptions()
    req = _validate(
        path, batch_size=batch_size, split=split, features=features, label=label,
        num_epochs=num_epochs, cache=cache, preprocess=preprocess, drop_remainder=drop_remainder,
        deterministic=deterministic, seed=seed, static_shapes=static_shapes,
        pad_lengths=pad_lengths, options=opts, skip_corrupt=skip_corrupt,
        image_args=dict(image_size=image_size, training=training, channels=channels, dtype=image_dtype, normalize=normalize),
        service=service, processing_mode=processing_mode,
    )
    # Counts are per worker under the tf.data service: only the client's total is known.
    check_counts = not skip_corrupt and service is None
    autotune = tf.data.AUTOTUNE
    parallel = opts.num_parallel_calls or autotune
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    plan = _shard_plan(req, num_pipelines=num_pipelines, pipeline_id=pipeline_id)
    if plan.record_shard is not None:
        logger.warning(
            "%s has %d shard file(s) for %d input pipelines: sharding by record instead of by file "
            "(every pipeline reads every file). Reconvert with --num_shards >= %d for file-level sharding.",
            req.path, len(plan.files), num_pipelines, num_pipelines,
        )
    ds = _records(req, opts, plan, shuffle=shuffle, seed=seed, skip_corrupt=skip_corrupt)
    if check_counts:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.records))
    split_bytes = req.split.bytes * plan.records / max(req.split.records, 1)
    if req.cache == "auto":
        budget = opts.cache_budget_bytes or _physical_memory() // 4
        if _plan.should_cache_in_memory(int(split_bytes), budget):
            ds = ds.cache()
        else:
            logger.info("cache='auto': %.0f MB does not fit the %.0f MB budget; not caching", split_bytes / 2**20, budget / 2**20)
    elif req.cache == "memory":
        ds = ds.cache()
    elif req.cache is not None:
        ds = ds.cache(req.cache)
    if shuffle:
        avg = split_bytes / max(plan.records, 1)
        buffer = _plan.shuffle_buffer(plan.records, avg, batch_size=batch_size, requested=opts.shuffle_buffer)
        ds = ds.shuffle(max(buffer, 1), seed=seed, reshuffle_each_iteration=True)
    if req.num_epochs != 1:
        ds = ds.repeat(req.num_epochs)
    if req.image is not None:
        ds = _decoded_images(ds, req, opts, seed=seed, skip_corrupt=skip_corrupt, drop_remainder=drop_remainder)
    else:
        ds = _parsed_batches(ds, req, opts, drop_remainder=drop_remainder)
    if req.num_epochs is not None and check_counts:
        total = plan.records * req.num_epochs
        ds = ds.apply(tf.data.experimental.assert_cardinality(_plan.batches(total, batch_size, drop_remainder=drop_remainder)))
    if preprocess is not None:
        ds = ds.map(preprocess, num_parallel_calls=parallel, deterministic=req.deterministic)
    if req.service is not None:
        # Everything above runs on the service's workers; the client only receives batches.
        ds = ds.with_options(_tf_options(req, opts, sharded=num_pipelines > 1))
        ds = ds.apply(tf.data.experimental.service.distribute(processing_mode=req.processing_mode, service=req.service))
        timeout = opts.service_timeout_s if opts.service_timeout_s is not None else _service.DEFAULT_TIMEOUT_S
        # Each record comes once, in batches of the records given: a stall after the last one is harmless.
        whole = req.processing_mode == "distributed_epoch" and req.num_epochs and preprocess is None and not skip_corrupt
        ds = _service.guard_stalls(ds, dispatcher=req.service, timeout_s=timeout,
                                   expected_records=plan.records * req.num_epochs if whole else None)
    ds = ds.prefetch(opts.prefetch if opts.prefetch is not None else autotune)
    return ds.with_options(_tf_options(req, opts, sharded=num_pipelines > 1))


def _parsed_batches(ds, req, opts, *, drop_remainder):
    """Serialized records -> batches of parsed features (and the label apart, if any)."""
    # Parse big blocks (cheaper per record), then cut them into the batches asked for.
    # Symbolic checkpoints cannot hold a rebatch: then parse each batch as it is.
    batch_size = req.batch_size
    block = batch_size if opts.symbolic_checkpoint else _plan.parse_block(batch_size, opts.parse_block)
    parse, split_label = _make_parser(req)
    ds = ds.batch(block, drop_remainder=drop_remainder and block == batch_size)
    ds = ds.map(parse, num_parallel_calls=opts.num_parallel_calls or tf.data.AUTOTUNE, deterministic=req.deterministic)
    if block != batch_size:
        ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
    return ds.map(split_label) if split_label is not None else ds


def _decoded_images(ds, req, opts, *, seed, skip_corrupt, drop_remainder):
    """Serialized records -> (image, label) batches: parse, decode, augment and finish per image."""
    parallel = opts.num_parallel_calls or tf.data.AUTOTUNE
    encoded_key = req.info.image["feature"]
    specs = {encoded_key: tf.io.FixedLenFeature([], tf.string)}
    if req.label is not None:
        specs[req.label] = _parse_spec(req.info.feature(req.label))
    # A seed per record, drawn in record order: augmentation is reproducible under a seed.
    # Under the tf.data service a second source would break splitting: draw seeds in the map.
    seeds = tf.data.Dataset.random(seed=seed).batch(2) if req.service is None else None
    formats = req.info.image.get("formats") or {}
    decode = _images.decode_fn(req.image, all_jpeg=set(formats) == {"jpeg"})
    # Cast and normalize per image: per batch (vectorized) measured the same within noise.
    finish = _images.finish_fn(req.image)
    label = req.label

    def decode_record(serialized, record_seed):
        # Parsed one by one, next to the decode: block parsing (the tabular path) copies
        # 1024 encoded images three times and measured 7% slower here.
        parsed = tf.io.parse_single_example(serialized, specs)
        image = finish(decode(parsed[encoded_key], record_seed))
        return (image, parsed[label]) if label is not None else image

    if seeds is not None:
        ds = tf.data.Dataset.zip((ds, seeds)).map(decode_record, num_parallel_calls=parallel, deterministic=req.deterministic)
    else:
        ds = ds.map(lambda s: decode_record(s, tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)),
                    num_parallel_calls=parallel, deterministic=req.deterministic)
    if skip_corrupt:
        # Images that fail to decode (shards written by other tools) are skipped and logged.
        ds = ds.ignore_errors(log_warning=True)
    return ds.batch(req.batch_size, drop_remainder=drop_remainder, num_parallel_calls=parallel, deterministic=req.deterministic)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30
