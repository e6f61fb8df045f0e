"""One `make_dataset` call, checked and resolved: the only input the graph-building stages read.

Every argument is checked here, before any graph is built or file is read beyond the
metadata and a directory listing, and every default that depends on something else
(the label, the features, determinism, the image options) is resolved once. What the
call reads from the recorded dataset comes in one pass (`ingest.metadata._facts`): the
checks of the call alone first, then the metadata's facts, then the pipeline's own.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Any, Callable, Mapping

import tensorflow as tf

from ingest import contract
from ingest.metadata import _facts
from ingest.names import did_you_mean
from ingest.pipeline import _service
from ingest.pipeline._options import ImageOptions, ReadOptions

__all__ = ["Request", "build", "image_options"]

_CACHE_MODES = (None, "memory", "auto")


@dataclasses.dataclass(frozen=True)
class Request:
    """What one make_dataset call asked for, checked, with its defaults resolved."""

    info: contract.DatasetInfo
    path: str  # without a trailing slash
    split: contract.SplitInfo
    options: ReadOptions
    features: tuple  # the features parsed, the label included
    label: str | None  # split off the features dict when set
    label_classes: tuple  # a text label's classes, when it is yielded as their index; else ()
    pad_lengths: dict
    static_shapes: bool
    batch_size: int
    drop_remainder: bool
    num_epochs: int | None  # None: repeat forever
    preprocess: Callable | None
    shuffle: bool
    seed: int | None
    deterministic: bool  # resolved: a seed asks for it
    cache: str | None  # None, "memory", "auto" or a file path
    image: ImageOptions | None  # set when the dataset's images are decoded
    skip_corrupt: bool
    num_pipelines: int = 1
    pipeline_id: int = 0
    service: str | None = None  # a tf.data service dispatcher, "grpc://host:port"
    processing_mode: str = "distributed_epoch"
    start_batch: Any = None  # None, an int >= 0, or a scalar integer tf.Variable read per iterator
    # Whether the blocks' bytes columns carry dictionary codes: True (format 3), False
    # (before), None (spans of both: each block says).
    text_codes: bool | None = None
    # The text features yielded as int64 ids of their vocabulary (`text="ids"`), not strings:
    # {name: its vocabulary's size}, the largest id a block may hold (the runtime checks it).
    text_ids: Mapping = dataclasses.field(default_factory=dict)
    # Set by ingest.stream for its worker processes, never by make_dataset's caller:
    # (k, K) reads only the windows w of the seekable order with w % K == k, and a scalar
    # int64 tf.Variable holds the pass the stream's consumer chose (read per iterator, as
    # start_batch is), so K processes built once deliver the windows of one order.
    window_slice: tuple = (0, 1)
    stream_pass: Any = None
    # {feature: the name of its missing-value mask}: the parsed features (label included)
    # whose records lack values somewhere, under missing="mask". Each parser adds the mask.
    masks: Mapping = dataclasses.field(default_factory=dict)

    @property
    def checks_counts(self) -> bool:
        """Whether the graph asserts record and batch counts from the metadata.

        Not when skipping corrupt records (counts fall short by design), nor under the
        tf.data service, whose workers each see a part: only the client's total is known.
        """
        return not self.skip_corrupt and self.service is None

    @property
    def sharded(self) -> bool:
        """Whether this pipeline reads a part of the split, one of several input pipelines."""
        return self.num_pipelines > 1


def image_options(image, *, image_size, training, channels, image_dtype, normalize) -> ImageOptions | None:
    """`image=` or the flat image keywords as one ImageOptions; None when neither asks for images."""
    flat = {"size": image_size, "training": training, "channels": channels, "dtype": image_dtype}
    given = {name: value for name, value in flat.items() if value is not None}
    if not (isinstance(normalize, str) and normalize == "default"):
        given["normalize"] = normalize
    if image is not None:
        if not isinstance(image, ImageOptions):
            raise ValueError(f"image must be an ingest.ImageOptions, got {type(image).__name__}")
        if given:
            keywords = sorted("image_" + k if k in ("size", "dtype") else k for k in given)
            raise ValueError(
                f"image options given twice: image={image!r} and the keywords {keywords}. Use one or the other: "
                "image=ingest.ImageOptions(size=..., training=..., ...) or image_size=..., training=..., ..."
            )
        return image
    if image_size is None:
        return None  # training/channels/... without a size: nothing asks to decode
    return ImageOptions(**given)


def build(
    path,
    *,
    split: str = "train",
    options: ReadOptions | None = None,
    batch_size: int = 1,
    features=None,
    label=None,
    label_ids: bool = True,
    pad_lengths=None,
    static_shapes: bool = False,
    drop_remainder: bool = False,
    num_epochs: int | None = 1,
    preprocess=None,
    shuffle: bool = False,
    seed: int | None = None,
    deterministic: bool | None = None,
    cache=None,
    image: ImageOptions | None = None,
    raw: bool = False,
    skip_corrupt: bool = False,
    num_pipelines: int = 1,
    pipeline_id: int = 0,
    service: str | None = None,
    processing_mode: str = "distributed_epoch",
    start_batch=None,
    text: str = "strings",
    missing: str = "mask",
) -> Request:
    """Checks one call's arguments against each other and the dataset's metadata.

    The defaults describe the plainest read: every record once, in file order, unbatched
    (batches of one). `raw=True` asks for serialized records only, so an image dataset
    needs no image options.
    """
    call = _check_call(
        ReadOptions() if options is None else options,
        batch_size=batch_size,
        num_epochs=num_epochs,
        preprocess=preprocess,
        start_batch=start_batch,
        num_pipelines=num_pipelines,
        pipeline_id=pipeline_id,
        seed=seed,
        shuffle=shuffle,
        deterministic=deterministic,
        skip_corrupt=skip_corrupt,
        service=service,
        processing_mode=processing_mode,
        static_shapes=static_shapes,
        drop_remainder=drop_remainder,
    )
    facts = _facts.gather(
        path,
        split=split,
        features=features,
        label=label,
        label_ids=label_ids,
        image_given=image is not None,
        raw=raw,
        skip_corrupt=skip_corrupt,
        text=text,
        missing=missing,
    )
    if not facts.images:
        image = None
    elif image.training is None:
        # Augment only what trains: another split, or any unshuffled read, gets the eval transform.
        image = dataclasses.replace(image, training=bool(split == "train" and shuffle))
    return Request(
        **call,
        info=facts.info,
        path=facts.root,
        split=facts.split,
        features=facts.features,
        label=facts.label,
        label_classes=facts.label_classes,
        pad_lengths=_checked_pad_lengths(facts.info, facts.features, pad_lengths, static_shapes),
        cache=_checked_cache(cache),
        image=image,
        text_codes=facts.text_codes,
        text_ids=facts.text_ids,
        masks=facts.masks,
    )


def _check_canonical(canonical: int, *, num_pipelines: int, batch_size: int, seed, num_epochs) -> None:
    """Refuses a canonical_pipelines setting that cannot give the same global batches for any count."""
    if canonical % num_pipelines:
        raise ValueError(
            f"ReadOptions.canonical_pipelines={canonical} is not a multiple of the {num_pipelines} input "
            "pipelines: each pipeline reads a whole number of canonical partitions. Use a count of "
            f"pipelines that divides {canonical}."
        )
    share = canonical // num_pipelines
    if batch_size % share:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by the {share} canonical partitions this pipeline "
            f"reads (ReadOptions.canonical_pipelines={canonical}, {num_pipelines} pipelines): each gives an "
            "equal part of every batch. Use a global batch size that is a multiple of canonical_pipelines."
        )
    if seed is None:
        raise ValueError(
            "ReadOptions.canonical_pipelines needs a seed: every pipeline, in this run and in a resumed one, "
            "must order the partitions the same way"
        )
    if num_epochs is not None:
        raise ValueError(
            "ReadOptions.canonical_pipelines needs num_epochs=None: the partitions can hold different numbers "
            "of rows, and a finite stream of each would end at a different batch"
        )


def _check_call(
    options,
    *,
    batch_size,
    num_epochs,
    preprocess,
    start_batch,
    num_pipelines,
    pipeline_id,
    seed,
    shuffle,
    deterministic,
    skip_corrupt,
    service,
    processing_mode,
    static_shapes,
    drop_remainder,
) -> dict:
    """The checks that need no metadata, before any file is read: the Request's fields the
    call gives, checked, the service address and determinism resolved."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1):
        raise ValueError(f"num_epochs must be a positive integer or None (repeat forever), got {num_epochs!r}")
    if preprocess is not None and not callable(preprocess):
        raise ValueError(f"preprocess must be a callable or None, got {preprocess!r}")
    if start_batch is not None:
        # distribute's global steps arrive scaled; their variable was checked there, as a step.
        if not isinstance(start_batch, ScaledStart):
            check_start(start_batch, name="start_batch", unit="batch", seed=seed)
    if isinstance(options, ReadOptions) and options.canonical_pipelines is not None:
        _check_canonical(
            options.canonical_pipelines,
            num_pipelines=num_pipelines,
            batch_size=batch_size,
            seed=seed,
            num_epochs=num_epochs,
        )
    if deterministic not in (None, True, False):
        raise ValueError(f"deterministic must be True, False or None, got {deterministic!r}")
    if not isinstance(options, ReadOptions):
        raise ValueError(f"options must be an ingest.ReadOptions, got {type(options).__name__}")
    if skip_corrupt and options.symbolic_checkpoint:
        raise ValueError(
            "skip_corrupt=True needs tf.data's ignore_errors, which symbolic checkpointing does not "
            "support: use ReadOptions(symbolic_checkpoint=False) or skip_corrupt=False"
        )
    if service is not None:
        if not isinstance(service, str) or not service.strip():
            raise ValueError(f"service must be a dispatcher address like 'grpc://host:5050', got {service!r}")
        service = service if "://" in service else "grpc://" + service
        if processing_mode not in _service.PROCESSING_MODES:
            raise ValueError(f"processing_mode must be one of {_service.PROCESSING_MODES}, got {processing_mode!r}")
    if static_shapes and not drop_remainder:
        raise ValueError("static_shapes=True needs drop_remainder=True, so that the batch dimension is fixed")
    return dict(
        options=options,
        batch_size=batch_size,
        num_epochs=num_epochs,
        preprocess=preprocess,
        start_batch=start_batch,
        num_pipelines=num_pipelines,
        pipeline_id=pipeline_id,
        seed=seed,
        shuffle=shuffle,
        # Out-of-order delivery is faster; a seed asks for reproducibility.
        deterministic=seed is not None if deterministic is None else deterministic,
        skip_corrupt=skip_corrupt,
        service=service,
        processing_mode=processing_mode,
        static_shapes=bool(static_shapes),
        drop_remainder=drop_remainder,
    )


def _checked_pad_lengths(info: contract.DatasetInfo, selected: list, pad_lengths, static_shapes: bool) -> dict:
    names = [f.name for f in info.features]
    pad_lengths = dict(pad_lengths or {})
    for name in pad_lengths:
        if name not in names:
            raise ValueError(
                f"pad_lengths names {name!r}{did_you_mean(name, names)}, which is not a feature; features: {names}"
            )
    if static_shapes:
        for f in info.features:
            if f.name in selected and f.is_variable_length and f.name not in pad_lengths and f.max_length is None:
                raise ValueError(
                    f"feature {f.name!r} has variable length and no recorded maximum: give "
                    f"pad_lengths={{{f.name!r}: N}} to use static_shapes=True"
                )
    return pad_lengths


def _checked_cache(cache):
    """None, a mode, or a writable file path with its directory."""
    if cache in _CACHE_MODES:
        return cache
    if not isinstance(cache, (str, os.PathLike)):
        raise ValueError(f"cache must be None, 'memory', 'auto' or a file path, got {cache!r}")
    cache = os.fspath(cache)
    if not os.path.dirname(cache):  # 'mem': a typo of a mode more likely than files in the working directory
        raise ValueError(
            f"cache={cache!r} is neither None, 'memory' nor 'auto', and as a file path it names no directory: "
            "pass a mode, or a path with its directory (e.g. './cache/c' or '/tmp/cache/c')"
        )
    _check_writable(cache)
    return cache


def check_start(start, *, name: str, unit: str, seed) -> None:
    """Refuses a start position (`name`: start_batch or start_step, counted in `unit`s)
    that is neither a non-negative int nor a scalar integer variable, or that has no seed."""
    if _is_variable(start):
        value = tf.convert_to_tensor(start)
        if value.shape.rank != 0 or not value.dtype.is_integer:
            raise ValueError(f"{name} must be a scalar integer variable, got {start!r}")
    elif isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"{name} must be a non-negative int or a scalar integer variable, got {start!r}")
    if seed is None:
        raise ValueError(
            f"{name} needs a seed: without one each run draws its own order, and {unit} N of "
            "another order is not where the interrupted run stopped"
        )


def _is_variable(value) -> bool:
    """A tf.Variable, or a Keras variable (its TensorFlow backend wraps one)."""
    return isinstance(value, tf.Variable) or isinstance(getattr(value, "value", None), tf.Variable)


@dataclasses.dataclass(frozen=True)
class ScaledStart:
    """A start_batch that is a variable times a whole number, read when an iterator is made
    (`distribute`'s global steps, for a pipeline giving `factor` batches a step)."""

    variable: Any
    factor: int

    def read(self) -> tf.Tensor:
        return tf.cast(tf.convert_to_tensor(self.variable), tf.int64) * self.factor


def read_start(start) -> tf.Tensor:
    """start_batch as an int64 scalar; a variable is read now (the iterator calls it as it
    makes its first batch, not when `iter()` makes the iterator).

    A variable's value is checked then: a negative one would seek before the stream.
    """
    name = "start_step" if isinstance(start, ScaledStart) else "start_batch"
    value = start.read() if isinstance(start, ScaledStart) else tf.cast(tf.convert_to_tensor(start), tf.int64)
    check = tf.debugging.assert_non_negative(
        value, message=f"{name} must be >= 0 (read from its variable when the iterator was made)"
    )
    with tf.control_dependencies([check]):
        return tf.identity(value)


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
