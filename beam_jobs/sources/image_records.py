"""Image records: check each file with a full decode, then store it untouched or re-encode.

    work item [ImageEntry] -> read bytes -> Pillow: identify, pixel limit, full decode
      -> keep the original bytes, or (EXIF-orient, to RGB, downsize) re-encode, or store
       the pixels themselves (--reencode raw: uint8 RGB, row-major [height, width, 3])
      -> Chunk of image/* columns + quarantined entries, in bounded batches

Stored images are always ones TensorFlow's decoders read (JPEG, PNG, GIF, BMP, WebP);
other formats Pillow reads (TIFF, ...) are re-encoded to PNG, losslessly.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Iterator

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import is_denied, storage_error
from beam_jobs.sources.readers import BadRow, Chunk

__all__ = [
    "ImageOptions",
    "ImageEntry",
    "BadImage",
    "prepare_image",
    "iter_image_chunks",
    "IMAGE_COLUMNS",
    "LABEL",
    "ENCODED",
    "RAW",
    "REENCODINGS",
]

ENCODED = "image/encoded"
LABEL = "image/class/label"
# (name, dtype) of the columns every image record has, in record order.
IMAGE_COLUMNS = (
    (ENCODED, "bytes"),
    ("image/format", "bytes"),
    ("image/height", "int64"),
    ("image/width", "int64"),
    ("image/channels", "int64"),
    (LABEL, "int64"),
    ("image/class/text", "bytes"),
    ("image/filename", "bytes"),
)
_ORIENTATION = 0x0112  # the EXIF tag
TF_DECODABLE = ("jpeg", "png", "gif", "bmp", "webp")
RAW = "raw"
REENCODINGS = ("jpeg", "png", RAW)
RAW_LAYOUT = "uint8 RGB, row-major [image/height, image/width, 3]"
# Pillow's own decompression-bomb threshold (its MAX_IMAGE_PIXELS): ~89 megapixels.
DEFAULT_MAX_PIXELS = 89_478_485
_CHANNELS = {
    "1": 1,
    "L": 1,
    "I": 1,
    "I;16": 1,
    "I;16B": 1,
    "I;16L": 1,
    "F": 1,
    "LA": 2,
    "La": 2,
    "RGB": 3,
    "YCbCr": 3,
    "LAB": 3,
    "HSV": 3,
    "RGBA": 4,
    "RGBa": 4,
    "CMYK": 4,
    "PA": 4,
}


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    max_side: int | None = None  # downsize so that the longer side is at most this
    reencode: str | None = None  # None (keep the original bytes), "jpeg", "png" or "raw" (decoded pixels)
    quality: int = 90  # JPEG quality when re-encoding
    max_pixels: int = DEFAULT_MAX_PIXELS
    batch_bytes: int = 32 << 20  # encoded bytes held per chunk: bounds memory per worker
    batch_images: int = 256

    def __post_init__(self):
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"--max_side must be a positive number of pixels, got {self.max_side}")
        if self.reencode not in (None,) + REENCODINGS:
            raise ValueError(f"--reencode must be one of {', '.join(REENCODINGS)}, got {self.reencode!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality must be in [1, 100], got {self.quality}")
        if self.max_pixels < 1:
            raise ValueError(f"--max_pixels must be positive, got {self.max_pixels}")

    def recorded(self) -> dict:
        recorded = {
            "max_side": self.max_side,
            "reencode": self.reencode,
            "quality": self.quality if self.reencode == "jpeg" or (self.max_side and self.reencode is None) else None,
            "max_pixels": self.max_pixels,
            "exif_orientation": "applied when re-encoding; original bytes are stored as they are",
        }
        if self.reencode == RAW:
            recorded["pixels"] = RAW_LAYOUT
        return recorded


@dataclasses.dataclass(frozen=True)
class ImageEntry:
    path: str  # as read (absolute or gs://)
    name: str  # relative path recorded in image/filename
    label: str | None  # class name; None when the manifest has none
    extras: tuple = ()  # values of the manifest's extra columns, in column order
    problem: tuple | None = None  # (kind, reason) found at listing: quarantined without a read


class BadImage(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Prepared:
    data: bytes
    format: str
    height: int
    width: int
    channels: int
    actions: tuple  # what was done, for the metadata's counters


def _pil():
    from PIL import Image, ImageOps

    # The pixel limit is ours (--max_pixels), checked before decoding.
    Image.MAX_IMAGE_PIXELS = None
    return Image, ImageOps


def prepare_image(data: bytes, opts: ImageOptions) -> Prepared:
    """Checks one encoded image by decoding it fully; returns what to store, or raises BadImage."""
    Image, ImageOps = _pil()
    if not data:
        raise BadImage("empty", "zero-byte file")
    try:
        img = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise BadImage("not_image", "not an image: no decoder recognises its content") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadImage("corrupt", f"unreadable image header: {e}") from None
    fmt = (img.format or "").lower()
    width, height = img.size
    if width * height > opts.max_pixels:
        raise BadImage(
            "too_large",
            f"{width}x{height} = {width * height:,} pixels is over --max_pixels={opts.max_pixels:,} "
            "(a decompression bomb?)",
        )
    needs_resize = opts.max_side is not None and max(width, height) > opts.max_side
    if needs_resize and fmt == "jpeg":
        img.draft("RGB", _fit(width, height, opts.max_side))  # DCT scaling: decodes at 1/2..1/8 directly
    try:
        img.load()
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error...
        raise BadImage("corrupt", f"{fmt.upper() or 'image'} data does not decode: {e}") from None
    target = opts.reencode or (None if fmt in TF_DECODABLE else "png")
    if target is None and not needs_resize:
        return Prepared(data, fmt, height, width, _channels(img), ())
    actions = []
    if target is None:  # resizing only: keep JPEG as JPEG, anything else becomes PNG
        target = "jpeg" if fmt == "jpeg" else "png"
    elif opts.reencode is None:
        actions.append("converted_to_png")
    if opts.reencode is not None:
        actions.append("reencoded")
        if img.getexif().get(_ORIENTATION, 1) != 1:
            img = ImageOps.exif_transpose(img)
            actions.append("exif_oriented")
        img = _to_rgb(img)
    elif target == "jpeg" or img.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
        img = _to_rgb(img)
    if needs_resize:
        img = img.resize(_fit(*img.size, opts.max_side), Image.Resampling.LANCZOS, reducing_gap=3.0)
        actions.append("resized")
    if target == RAW:
        # The pixels themselves: the runtime slices its crop out of them with no decode.
        return Prepared(np.asarray(img, np.uint8).tobytes(), RAW, img.size[1], img.size[0], 3, tuple(actions))
    out = io.BytesIO()
    if target == "jpeg":
        img.save(out, "JPEG", quality=opts.quality, optimize=False)
    else:
        img.save(out, "PNG", compress_level=6)
    return Prepared(out.getvalue(), target, img.size[1], img.size[0], _channels(img), tuple(actions))


def _channels(img) -> int:
    """Channels a decoder returns for this image (palette images decode to RGB or RGBA)."""
    if img.mode == "P":
        return 4 if "transparency" in img.info else 3
    return _CHANNELS.get(img.mode, len(img.getbands()))


def _fit(width: int, height: int, max_side: int) -> tuple:
    scale = max_side / max(width, height)
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _to_rgb(img):
    """Any mode -> RGB: 16-bit scaled to 8, alpha composited on white, CMYK/palette converted."""
    from PIL import Image

    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if img.mode != "F" else max(float(arr.max()), 1.0)
        img = Image.fromarray(np.clip(arr * (255.0 / peak), 0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "La", "RGBa", "PA"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB") if img.mode != "RGB" else img


def _read(path: str) -> bytes:
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return f.read()
    except Exception as e:  # Beam's filesystems raise several types
        if is_denied(e):  # not the image's fault: granting access makes it readable, so no quarantine
            raise storage_error("read", "--input", path, e) from e
        raise BadImage("unreadable", f"cannot read {path}: {e}") from None


def iter_image_chunks(entries, opts: ImageOptions, vocabulary: tuple, extra_types: tuple) -> Iterator[Chunk]:
    """Entries -> Chunks of image columns (plus manifest extras), at most `batch_bytes` each.

    `rows` holds each record's position in the work item; bad entries become BadRows
    with the image path as their source (and no row number).
    """
    index = {name: i for i, name in enumerate(vocabulary)}
    pending, rows, bad, actions = [], [], [], {}
    held = 0
    for position, entry in enumerate(entries):
        try:
            if entry.problem is not None:
                raise BadImage(*entry.problem)
            if entry.label is None or entry.label == "":
                raise BadImage("missing_label", "the manifest gives no label for this image")
            if entry.label not in index:  # cannot happen for vocabularies built at launch
                raise BadImage("missing_label", f"label {entry.label!r} is not in the vocabulary")
            prepared = prepare_image(_read(entry.path), opts)
        except BadImage as e:
            bad.append(BadRow(entry.path, None, e.reason, entry.name, e.kind))
            continue
        for a in prepared.actions:
            actions[a] = actions.get(a, 0) + 1
        actions["format:" + prepared.format] = actions.get("format:" + prepared.format, 0) + 1
        pending.append((entry, prepared))
        rows.append(position)
        held += len(prepared.data)
        if held >= opts.batch_bytes or len(pending) >= opts.batch_images:
            yield _chunk(pending, rows, bad, actions, index, extra_types)
            pending, rows, bad, actions, held = [], [], [], {}, 0
    if pending or bad:
        yield _chunk(pending, rows, bad, actions, index, extra_types)


def _chunk(pending, rows, bad, actions, index, extra_types) -> Chunk:
    columns = {
        ENCODED: pa.array([p.data for _, p in pending], pa.large_binary()),
        "image/format": pa.array([p.format.encode() for _, p in pending], pa.large_binary()),
        "image/height": pa.array([p.height for _, p in pending], pa.int64()),
        "image/width": pa.array([p.width for _, p in pending], pa.int64()),
        "image/channels": pa.array([p.channels for _, p in pending], pa.int64()),
        LABEL: pa.array([index[e.label] for e, _ in pending], pa.int64()),
        "image/class/text": pa.array([e.label.encode() for e, _ in pending], pa.large_binary()),
        "image/filename": pa.array([e.name.encode() for e, _ in pending], pa.large_binary()),
    }
    for i, (name, arrow_type) in enumerate(extra_types):
        columns[name] = pa.array([e.extras[i] for e, _ in pending], arrow_type)
    batch = pa.RecordBatch.from_pydict(columns)
    return Chunk(batch, np.asarray(rows, np.int64), list(bad), counters=dict(actions))
