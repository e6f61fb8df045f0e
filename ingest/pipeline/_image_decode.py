"""Image decode and augmentation inside the tf.data graph (the runtime side; `beam_jobs` reads images too).

    encoded bytes (or raw pixels and their shape) + per-record seed
      -> training: sample a crop window (ImageOptions.crop_area, crop_aspect) from the
         header's shape; JPEG: decode only that window (decode_and_crop_jpeg), raw: slice
         it, no decode; others: decode, then slice; random flip (ImageOptions.flip); resize
      -> eval: the central crop (87.5% of the shorter side) and a resize
      -> images no larger than the output: whole (unless ImageOptions.crop_small)
      -> cast and normalize

Per-record seeds make augmentation reproducible for a seeded pipeline whatever the
order in which parallel map calls finish.
"""

from __future__ import annotations

import tensorflow as tf

from ingest.pipeline._options import ImageOptions

__all__ = ["decode_fn", "finish_fn", "window_fn", "RAW"]

_DTYPES = {"uint8": tf.uint8, "float32": tf.float32, "bfloat16": tf.bfloat16}
_EVAL_CROP_FRACTION = 0.875
_SCALES = (2, 4, 8)  # libjpeg's DCT scaling factors beyond 1 (a tensor made at import would start TF's runtime)
RAW = "raw"  # the stored format of `--reencode raw`: uint8 RGB pixels, row-major [height, width, 3]


def _random_window(shape, seed, spec: ImageOptions):
    """(offset_y, offset_x, height, width) of a random-resized-crop window inside `shape` [H, W, C]."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        # The box is the whole image, so this is the crop's least area: the range's own minimum
        # (a fixed 0.1 would refuse every crop of a range below it and fall back to the whole image).
        min_object_covered=spec.crop_area[0],
        aspect_ratio_range=spec.crop_aspect,
        area_range=spec.crop_area,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[0], begin[1], size[0], size[1]


def _central_window(shape, target):
    """The largest window of the target's aspect ratio, scaled by the crop fraction, centred."""
    h = tf.cast(shape[0], tf.float32)
    w = tf.cast(shape[1], tf.float32)
    scale = _EVAL_CROP_FRACTION * tf.minimum(h / target[0], w / target[1])
    ch = tf.maximum(tf.cast(target[0] * scale, tf.int32), 1)
    cw = tf.maximum(tf.cast(target[1] * scale, tf.int32), 1)
    return (shape[0] - ch + 1) // 2, (shape[1] - cw + 1) // 2, ch, cw


def _whole(shape):
    return tf.constant(0), tf.constant(0), shape[0], shape[1]


def window_fn(spec: ImageOptions, *, small_images: bool = True):
    """(int32 shape [H, W, C], seed[2]) -> (offset_y, offset_x, height, width) of the pixels to keep.

    `small_images=False` (the statistics prove no image is within the output size) leaves
    out the check for them: 14 of the JPEG path's 76 ops an image (7 of them constants).
    """

    def window(shape, seed):
        if spec.training and spec.crop_area is None:
            return _whole(shape)
        cropped = _random_window(shape, seed, spec) if spec.training else _central_window(shape, spec.size)
        if spec.crop_small or not small_images:
            return cropped
        # Images no larger than the output are taken whole: a crop would only upsample fewer pixels.
        # One vector select, not four scalar ones: 14 ops an image against 27.
        extent = shape[:2]
        small = tf.reduce_all(extent <= spec.size)
        return tf.unstack(tf.where(small, tf.concat([[0, 0], extent], 0), tf.stack(cropped)))

    return window


def decode_fn(spec: ImageOptions, *, formats=(), small_images: bool = True):
    """(encoded, seed[2], shape, format) -> float32 [H, W, C] in 0-255: cropped, flipped, resized.

    `formats` are the stored formats the metadata records: only JPEGs drop the per-image
    format check; raw pixels (`--reencode raw`) need `shape` ([height, width]), and
    `format` (the record's image/format) when they are mixed with encoded images.
    `small_images`: whether an image may be no larger than the output (see window_fn).
    """
    formats = set(formats)
    channels = spec.channels
    window = window_fn(spec, small_images=small_images)

    def decode(encoded, seed, shape=None, fmt=None):
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        if formats == {"jpeg"}:
            image = _jpeg(encoded, crop_seed, window, spec)
        elif formats == {RAW}:
            image = _raw(encoded, shape, crop_seed, window, channels)
        elif RAW in formats:
            image = tf.cond(
                tf.equal(fmt, RAW),
                lambda: _raw(encoded, shape, crop_seed, window, channels),
                lambda: _encoded(encoded, crop_seed, window, spec),
            )
        else:
            image = _encoded(encoded, crop_seed, window, spec)
        image = tf.ensure_shape(image, [None, None, channels])
        if spec.training and spec.flip:
            # Flipped before the resize: the window's uint8 pixels, not the float output (1 byte
            # a value against 4). A column gather, a batch-level select and
            # crop_and_resize with a mirrored box all measured slower than this cond (TF 2.21, 2 cores).
            image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
        # ResizeBilinear reads float input faster than uint8 (it converts every sample it
        # reads): the same values, and ~6% more raw 256 images/s on 2 cores.
        return tf.image.resize(tf.cast(image, tf.float32), spec.size)

    return decode


def _encoded(encoded, crop_seed, window, spec):
    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: _jpeg(encoded, crop_seed, window, spec),
        lambda: _other(encoded, crop_seed, window, spec.channels),
    )


def _jpeg(encoded, crop_seed, window, spec):
    # Only the window is decoded: outside it the IDCT and colour conversion are skipped.
    y, x, h, w = window(tf.image.extract_jpeg_shape(encoded), crop_seed)
    # Windows at least 2x, 4x or 8x the output are decoded at that reduced scale by the
    # IDCT itself (libjpeg DCT scaling); the window is given in scaled coordinates.
    scales = tf.constant(_SCALES, h.dtype)
    fits = tf.logical_and(h >= scales * spec.size[0], w >= scales * spec.size[1])
    scale = tf.reduce_sum(tf.cast(fits, tf.int32))

    def at(ratio):
        def decode_scaled():
            # Round the window inwards, so no scaled pixel averages pixels from outside it.
            top, left = -(-y // ratio), -(-x // ratio)
            bottom, right = (y + h) // ratio, (x + w) // ratio
            box = tf.stack([top, left, bottom - top, right - left])
            return tf.io.decode_and_crop_jpeg(encoded, box, channels=3, ratio=ratio)

        return decode_scaled

    image = tf.switch_case(scale, [at(1), at(2), at(4), at(8)])
    # libjpeg cannot convert CMYK JPEGs to grayscale ("Unsupported color conversion
    # request"): decode to RGB, then convert, as for the other formats.
    return tf.image.rgb_to_grayscale(image) if spec.channels == 1 else image


def _other(encoded, crop_seed, window, channels):
    # GIF decodes to RGB only; grayscale is converted after decoding.
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False, dtype=tf.uint8)
    if channels == 1:
        image = tf.image.rgb_to_grayscale(image)
    y, x, h, w = window(tf.shape(image), crop_seed)
    return tf.slice(image, tf.stack([y, x, 0]), tf.stack([h, w, channels]))


def _raw(encoded, shape, crop_seed, window, channels):
    # No decode: the stored bytes are the pixels; only the window is copied (and converted).
    shape = tf.concat([tf.cast(shape, tf.int32), [3]], 0)
    pixels = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), shape)
    y, x, h, w = window(shape, crop_seed)
    image = tf.slice(pixels, tf.stack([y, x, 0]), tf.stack([h, w, 3]))
    return tf.image.rgb_to_grayscale(image) if channels == 1 else image


def finish_fn(spec: ImageOptions):
    """Float32 0-255 image(s) -> the requested dtype and normalization."""
    out = _DTYPES[spec.dtype]
    mean_std = spec.mean_std

    def finish(images):
        if spec.dtype == "uint8":
            return tf.cast(tf.clip_by_value(tf.round(images), 0.0, 255.0), tf.uint8)
        if spec.scale:
            images = images * (1.0 / 255.0)
        if mean_std is not None:
            images = (images - tf.constant(mean_std[0])) / tf.constant(mean_std[1])
        return tf.cast(images, out)

    return finish
