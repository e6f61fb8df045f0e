"""The parse stage: serialized records -> batches of features, or of decoded images.

Tabular records are batched into large blocks before parsing: parse_example costs much
less per record on whole blocks (1.3-1.5x cheaper than per-256-record batches), and the
parsed blocks are re-cut to batch_size. Images are parsed one by one, next to their decode.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import tensorflow as tf

from ingest import contract
from ingest.pipeline import _image_decode, _tuning
from ingest.pipeline.blocks.parse import as_float64

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["parsed_batches", "decoded_images", "selected_features", "padder", "label_splitter"]

logger = logging.getLogger(__name__)

# float64 is parsed as the int64 bit patterns it is stored as (`as_float64`).
_TF_DTYPES = {"int64": tf.int64, "float32": tf.float32, "float64": tf.int64, "bytes": tf.string}


def _stored_default(f: contract.FeatureSpec):
    """The feature's default as a record stores it: bytes UTF-8, a float64 its bit pattern."""
    if f.dtype == "bytes" and isinstance(f.default, str):
        return f.default.encode()
    return contract.float64_bits(f.default) if f.dtype == "float64" else f.default


def _parse_spec(f: contract.FeatureSpec):
    dtype = _TF_DTYPES[f.dtype]
    default = _stored_default(f)
    if f.is_scalar:
        return tf.io.FixedLenFeature([], dtype, default_value=default if f.missing else None)
    if not f.is_variable_length:
        (k,) = f.shape
        return tf.io.FixedLenFeature([k], dtype, default_value=[default] * k if f.missing else None)
    return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)


def selected_features(req: Request) -> list:
    """The FeatureSpecs of the features parsed, in the metadata's order."""
    return [f for f in req.info.features if f.name in req.features]


def padder(req: Request):
    """{name: ragged [R, None]} -> the same with the padded features dense [R, length]."""
    pad = {}
    for f in selected_features(req):
        if f.is_variable_length and (f.name in req.pad_lengths or req.static_shapes):
            length = req.pad_lengths.get(f.name, f.max_length)
            default = 0 if f.name in req.text_ids else f.default.encode() if f.dtype == "bytes" else f.default
            pad[f.name] = (int(length), default)

    def padded(parsed):
        for name, (length, default) in pad.items():
            # Pads short rows and truncates long ones to a fixed length.
            parsed[name] = parsed[name].to_tensor(default_value=default, shape=[None, length])
        return parsed

    return padded


def label_splitter(req: Request):
    """A map from the features dict to `(features, label)`, or None when there is no label."""
    label = req.label
    if label is None:
        return None
    ids = None
    if req.label_classes:  # a text label, yielded as the index of its class
        classes = tf.constant(list(req.label_classes))
        ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(classes, tf.range(len(req.label_classes), dtype=tf.int64)), -1
        )

    def split_label(parsed):
        parsed = dict(parsed)
        y = parsed.pop(label)
        return parsed, (y if ids is None else ids.lookup(y))

    return split_label


def _make_parser(req: Request):
    features = selected_features(req)
    specs = {f.name: _parse_spec(f) for f in features}
    # A masked feature is parsed ragged: a record that lacks it has no value there, which
    # a dense parse would hide under the default.
    masked = {f.name: f for f in features if f.name in req.masks}
    for name in masked:
        specs[name] = tf.io.RaggedFeature(_TF_DTYPES[masked[name].dtype], row_splits_dtype=tf.int64)
    _warn_empty_lists(req, masked.values())
    padded = padder(req)
    wide = [f.name for f in features if f.dtype == "float64"]

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, specs)
        for name, f in masked.items():
            parsed[name], parsed[req.masks[name]] = _filled(f, parsed[name])
        parsed.update({name: as_float64(parsed[name]) for name in wide})
        return padded(parsed)

    return parse, label_splitter(req)


def _filled(f: contract.FeatureSpec, values: tf.RaggedTensor):
    """A masked feature's ragged values -> (the values as the unmasked parse gives them, the
    [R] bool mask: True where the record had no value)."""
    lengths = values.row_lengths()
    mask = tf.equal(lengths, 0)
    if f.is_variable_length:
        return values, mask
    width = 1 if f.is_scalar else f.shape[0]
    # The dense parse refuses a record holding another count of values; so does this.
    check = tf.debugging.Assert(
        tf.reduce_all(tf.logical_or(mask, tf.equal(lengths, width))),
        [f"feature {f.name!r}: a record holds other than {width} value(s): ", tf.reduce_max(lengths)],
    )
    with tf.control_dependencies([check]):  # still bit patterns for a float64, as it is stored
        dense = values.to_tensor(default_value=_stored_default(f), shape=[None, width])
    return (dense[:, 0] if f.is_scalar else dense), mask


def _warn_empty_lists(req: Request, features) -> None:
    """A record of the rows layout omits a missing list, and keeps an empty list empty:
    tf.io.parse_example reads both as empty, so the mask cannot tell them apart when the
    feature holds empty lists as well (the blocks layout can)."""
    for f in features:
        if f.is_variable_length and (f.min_length is None or f.min_length == 0):
            logger.warning(
                "feature %r of %s (--layout rows) has missing lists and may hold empty ones: its mask %r is "
                "True at both (a record of the rows layout cannot tell them apart). Reconvert with --layout "
                "blocks (the default) for a mask of the missing ones alone",
                f.name,
                req.path,
                req.masks[f.name],
            )


def parsed_batches(ds: tf.data.Dataset, req: Request) -> tf.data.Dataset:
    """Serialized records -> batches of parsed features (and the label apart, if any)."""
    # Parse big blocks (cheaper per record), then cut them into the batches asked for.
    # Symbolic checkpoints cannot hold a rebatch: then parse each batch as it is.
    opts, batch_size, drop_remainder = req.options, req.batch_size, req.drop_remainder
    block = batch_size if opts.symbolic_checkpoint else _tuning.parse_block(batch_size, opts.parse_block)
    parse, split_label = _make_parser(req)
    ds = ds.batch(block, drop_remainder=drop_remainder and block == batch_size)
    ds = ds.map(parse, num_parallel_calls=opts.num_parallel_calls or tf.data.AUTOTUNE, deterministic=req.deterministic)
    if block != batch_size:
        ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
    return ds.map(split_label) if split_label is not None else ds


def decoded_images(ds: tf.data.Dataset, req: Request) -> tf.data.Dataset:
    """Serialized records -> (image, label) batches: parse, decode, augment and finish per image."""
    parallel = req.options.num_parallel_calls or tf.data.AUTOTUNE
    encoded_key = req.info.image["feature"]
    specs = {encoded_key: tf.io.FixedLenFeature([], tf.string)}
    if req.label is not None:
        specs[req.label] = _parse_spec(req.info.feature(req.label))
    # A seed per record, drawn in record order: augmentation is reproducible under a seed.
    # Under the tf.data service a second source would break splitting: draw seeds in the map.
    seeds = tf.data.Dataset.random(seed=req.seed).batch(2) if req.service is None else None
    formats = set(req.info.image.get("formats") or {})
    # Raw pixels (--reencode raw) carry no header: their shape is in the record, and when
    # they are mixed with encoded images, so is which one each record is.
    extra = {}
    if _image_decode.RAW in formats:
        extra = {"shape": ["image/height", "image/width"]}
        specs.update({k: tf.io.FixedLenFeature([], tf.int64) for k in extra["shape"]})
        if len(formats) > 1:
            extra["fmt"] = "image/format"
            specs["image/format"] = tf.io.FixedLenFeature([], tf.string)
    decode = _image_decode.decode_fn(req.image, formats=formats, small_images=_may_be_small(req.info, req.image.size))
    # Cast and normalize per image: per batch (vectorized) measured the same within noise.
    finish = _image_decode.finish_fn(req.image)
    label = req.label

    def decode_record(serialized, record_seed):
        # Parsed one by one, next to the decode: block parsing (the tabular path) copies
        # 1024 encoded images three times and measured 7% slower here.
        parsed = tf.io.parse_single_example(serialized, specs)
        shape = tf.stack([parsed[k] for k in extra["shape"]]) if "shape" in extra else None
        fmt = parsed[extra["fmt"]] if "fmt" in extra else None
        image = finish(decode(parsed[encoded_key], record_seed, shape, fmt))
        if label is None:
            return image
        return image, as_float64(parsed[label]) if req.info.feature(label).dtype == "float64" else parsed[label]

    if seeds is not None:
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            decode_record, num_parallel_calls=parallel, deterministic=req.deterministic
        )
    else:
        ds = ds.map(
            lambda s: decode_record(s, tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)),
            num_parallel_calls=parallel,
            deterministic=req.deterministic,
        )
    if req.skip_corrupt:
        # Images that fail to decode (shards written by other tools) are skipped and logged.
        ds = ds.ignore_errors(log_warning=True)
    # A plain batch: tf.data fuses it with the map (map_and_batch_fusion), each image written
    # straight into its batch; a parallel batch here measured 8% slower on raw pixels and 15%
    # on the original JPEGs (2 cores). With skip_corrupt, tf.data's parallel_batch rewrite
    # still makes it parallel.
    return ds.batch(req.batch_size, drop_remainder=req.drop_remainder)


def _may_be_small(info: contract.DatasetInfo, size: tuple) -> bool:
    """Whether an image may be no larger than `size` on both sides: False only when the recorded
    statistics prove every image taller or wider (then no image is taken whole for it)."""
    stats = info.statistics
    if stats is None:
        return True
    heights, widths = stats.overall.get("image/height"), stats.overall.get("image/width")
    if heights is None or widths is None or heights.min is None or widths.min is None:
        return True
    return not (heights.min > size[0] or widths.min > size[1])
