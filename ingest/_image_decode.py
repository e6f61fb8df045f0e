"""Image decode and augmentation inside the tf.data graph (the runtime side; `beam_jobs` reads images too).

    encoded bytes + per-record seed
      -> training: sample a crop window from the header's shape; JPEG: decode only that
         window (decode_and_crop_jpeg), others: decode, then slice; resize; random flip
      -> eval: the central crop (87.5% of the shorter side) and a resize
      -> cast and normalize

Per-record seeds make augmentation reproducible for a seeded pipeline whatever the
order in which parallel map calls finish.
"""

from __future__ import annotations

import tensorflow as tf

from ingest._options import ImageOptions

__all__ = ["decode_fn", "finish_fn"]

_DTYPES = {"uint8": tf.uint8, "float32": tf.float32, "bfloat16": tf.bfloat16}
# Random-resized-crop ranges of the Inception/ResNet recipes (area 8%-100%, aspect 3/4-4/3).
_AREA_RANGE = (0.08, 1.0)
_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
_EVAL_CROP_FRACTION = 0.875
_SCALES = tf.constant([2, 4, 8])  # libjpeg's DCT scaling factors beyond 1


def _random_window(shape, seed):
    """(offset_y, offset_x, height, width) of a random-resized-crop window inside `shape`."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=_ASPECT_RANGE,
        area_range=_AREA_RANGE,
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


def decode_fn(spec: ImageOptions, *, all_jpeg: bool = False):
    """(encoded, seed[2]) -> float32 [H, W, C] in 0-255, cropped, resized and (training) flipped.

    `all_jpeg` (the metadata says every image is a JPEG) drops the per-image format
    check; others take the general decoder when they are not JPEGs.
    """
    channels = spec.channels

    def window(shape, seed):
        return _random_window(shape, seed) if spec.training else _central_window(shape, spec.size)

    def decode(encoded, seed):
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))

        def jpeg():
            # Only the window is decoded: outside it the IDCT and colour conversion are skipped.
            y, x, h, w = window(tf.image.extract_jpeg_shape(encoded), crop_seed)
            # Windows at least 2x, 4x or 8x the output are decoded at that reduced scale by the
            # IDCT itself (libjpeg DCT scaling); the window is given in scaled coordinates.
            fits = tf.logical_and(h >= _SCALES * spec.size[0], w >= _SCALES * spec.size[1])
            scale = tf.reduce_sum(tf.cast(fits, tf.int32))

            def at(ratio):
                def decode_scaled():
                    # Round the window inwards, so no scaled pixel averages pixels from outside it.
                    top, left = -(-y // ratio), -(-x // ratio)
                    bottom, right = (y + h) // ratio, (x + w) // ratio
                    window = tf.stack([top, left, bottom - top, right - left])
                    return tf.io.decode_and_crop_jpeg(encoded, window, channels=3, ratio=ratio)

                return decode_scaled

            image = tf.switch_case(scale, [at(1), at(2), at(4), at(8)])
            # libjpeg cannot convert CMYK JPEGs to grayscale ("Unsupported color conversion
            # request"): decode to RGB, then convert, as for the other formats.
            return tf.image.rgb_to_grayscale(image) if channels == 1 else image

        def other():
            # GIF decodes to RGB only; grayscale is converted after decoding.
            image = tf.io.decode_image(encoded, channels=3, expand_animations=False, dtype=tf.uint8)
            if channels == 1:
                image = tf.image.rgb_to_grayscale(image)
            y, x, h, w = window(tf.shape(image), crop_seed)
            return tf.slice(image, tf.stack([y, x, 0]), tf.stack([h, w, channels]))

        image = jpeg() if all_jpeg else tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
        image = tf.ensure_shape(image, [None, None, channels])
        image = tf.image.resize(image, spec.size)
        if spec.training:
            # A column gather, a batch-level select and crop_and_resize with a mirrored box
            # all measured slower than this cond (TF 2.21, 2 cores).
            image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
        return image

    return decode


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
