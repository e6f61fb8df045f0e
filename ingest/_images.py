"""Image decode and augmentation inside the tf.data graph.

    encoded bytes + per-record seed
      -> training: sample a crop window from the header's shape; JPEG: decode only that
         window (decode_and_crop_jpeg), others: decode, then slice; resize; random flip
      -> eval: the central crop (87.5% of the shorter side) and a resize
      -> cast and normalize

Per-record seeds make augmentation reproducible for a seeded pipeline whatever the
order in which parallel map calls finish.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

__all__ = ["ImageSpec", "make_image_spec", "decode_fn", "finish_fn"]

_DTYPES = {"uint8": tf.uint8, "float32": tf.float32, "bfloat16": tf.bfloat16}
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# Random-resized-crop ranges of the Inception/ResNet recipes (area 8%-100%, aspect 3/4-4/3).
_AREA_RANGE = (0.08, 1.0)
_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
_EVAL_CROP_FRACTION = 0.875
_SCALES = tf.constant([2, 4, 8])  # libjpeg's DCT scaling factors beyond 1


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    size: tuple  # (height, width)
    training: bool
    channels: int
    dtype: str
    mean: tuple | None  # in [0, 1] units, per channel; None: no mean/std step
    std: tuple | None
    scale: bool  # divide by 255


def make_image_spec(image_size, *, training, channels, dtype, normalize) -> ImageSpec:
    try:
        height, width = (int(v) for v in image_size)
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (height, width), got {image_size!r}") from None
    if height < 1 or width < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    if training not in (True, False):
        raise ValueError(f"training must be True or False, got {training!r}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"image_dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if normalize == "default":
        normalize = None if dtype == "uint8" else "unit"
    mean = std = None
    if normalize is None:
        scale = False
    elif normalize == "unit":
        scale = True
    elif normalize == "imagenet" or (isinstance(normalize, (tuple, list)) and len(normalize) == 2):
        mean, std = IMAGENET_MEAN_STD if normalize == "imagenet" else normalize
        mean = tuple(float(v) for v in mean)
        std = tuple(float(v) for v in std)
        if len(mean) != channels or len(std) != channels or min(std) <= 0:
            raise ValueError(f"normalize=(mean, std) needs {channels} values each and positive std, got {normalize!r}")
        scale = True
    else:
        raise ValueError(f"normalize must be None, 'unit', 'imagenet' or (mean, std), got {normalize!r}")
    if dtype == "uint8" and scale:
        raise ValueError("image_dtype='uint8' keeps pixel values 0-255: use normalize=None, or a float image_dtype")
    return ImageSpec((height, width), training, channels, dtype, mean, std, scale)


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


def decode_fn(spec: ImageSpec, *, all_jpeg: bool = False):
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
            scale = tf.reduce_sum(tf.cast(tf.logical_and(h >= _SCALES * spec.size[0], w >= _SCALES * spec.size[1]), tf.int32))

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


def finish_fn(spec: ImageSpec):
    """Float32 0-255 image(s) -> the requested dtype and normalization."""
    out = _DTYPES[spec.dtype]

    def finish(images):
        if spec.dtype == "uint8":
            return tf.cast(tf.clip_by_value(tf.round(images), 0.0, 255.0), tf.uint8)
        if spec.scale:
            images = images * (1.0 / 255.0)
        if spec.mean is not None:
            images = (images - tf.constant(spec.mean)) / tf.constant(spec.std)
        return tf.cast(images, out)

    return finish
