"""Images: a class-per-folder tree or a manifest, listed at launch into groups of entries."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from beam_jobs._errors import ConversionError
from beam_jobs.sources import column_types, image_listing, image_records
from beam_jobs.sources.base import Source, WorkItem, flag
from beam_jobs.sources.parquet import type_arrow_chunk

__all__ = ["ImageSource"]


@dataclasses.dataclass(frozen=True)
class ImageSource(Source):
    images: image_records.ImageOptions = image_records.ImageOptions()
    labels: tuple = ()  # label names; the label index is the position
    extra_types: tuple = ()  # manifest extras: ((name, pyarrow type), ...)
    arrow_types: tuple = ()  # ((name, dtype, shape), ...)
    # Work items go to the pipeline as elements, never to workers with the config.
    items: tuple = dataclasses.field(default=(), compare=False, repr=False)

    format: ClassVar[str] = "images"
    unit: ClassVar[str] = "image"
    fixed_label: ClassVar[str | None] = image_records.LABEL
    layouts: ClassVar[tuple] = ("rows",)  # one image per record

    @classmethod
    def add_flags(cls, group) -> None:
        flag(
            group, "path_column", default="path", help="manifest column holding image paths (relative to the manifest)"
        )
        flag(group, "max_side", type=int, help="downsize images whose longer side exceeds this many pixels")
        flag(
            group,
            "reencode",
            choices=list(image_records.REENCODINGS),
            help="re-encode every image (EXIF-oriented, RGB), or store its decoded uint8 pixels (raw: no decode "
            "when read, several times the bytes); default: keep the original bytes",
        )
        flag(group, "quality", type=int, default=90, help="JPEG quality when re-encoding or downsizing JPEGs")
        flag(
            group,
            "max_pixels",
            type=int,
            default=image_records.DEFAULT_MAX_PIXELS,
            help="quarantine images with more pixels (decompression bombs)",
        )

    @classmethod
    def check_flags(cls, args) -> None:
        if args.schema_from is not None:
            # An image dataset's features are the image's own, its classes its folders' or
            # manifest's: there is no tabular schema to carry into it.
            raise ConversionError(
                "--schema_from applies to --source csv and parquet (and WriteDataset), not --source images: an "
                "image dataset's features are fixed and its classes come from the labels it lists; drop --schema_from"
            )
        cls._options(args)

    @staticmethod
    def _options(args) -> image_records.ImageOptions:
        try:
            return image_records.ImageOptions(
                max_side=args.max_side, reencode=args.reencode, quality=args.quality, max_pixels=args.max_pixels
            )
        except ValueError as e:
            raise ConversionError(str(e)) from e

    @classmethod
    def open(cls, args) -> "ImageSource":
        try:
            if image_listing.is_manifest(args.input):
                columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
                corpus = image_listing.read_manifest(
                    args.input, path_column=args.path_column, label_column=args.label or "label", columns=columns
                )
            else:
                corpus = image_listing.list_folder(args.input)
        except ValueError as e:
            raise ConversionError(str(e)) from e
        types = [(name, dtype, ()) for name, dtype in image_records.IMAGE_COLUMNS]
        types += [(name, *column_types.arrow_dtype(name, t)) for name, t in corpus.extra_types]
        return cls(
            input_pattern=args.input,
            columns=tuple(name for name, _, _ in types),
            input_bytes=corpus.input_bytes,
            input_count=len(corpus.entries),
            schema_origin="images",
            binary_columns=(image_records.ENCODED,),
            images=cls._options(args),
            labels=corpus.vocabulary,
            extra_types=corpus.extra_types,
            arrow_types=tuple(types),
            items=tuple(image_listing.work_items(corpus)),
        )

    def expansion(self) -> float:
        # Stored as encoded (a few hundred bytes of features each): about 1x, less when
        # --max_side shrinks them.
        return 1.0

    def planned_bytes(self, type_counts) -> int:
        if self.images.reencode != image_records.RAW:
            return super().planned_bytes(type_counts)
        # Raw pixels are 3 bytes a pixel, ~10x a photo's JPEG (q90: ~2.4 bits a pixel); with
        # --max_side, at most a 4:3 image of that side each.
        if self.images.max_side:
            side = self.images.max_side
            return min(self.input_count * side * side * 3 * 3 // 4, self.input_bytes * 10)
        return self.input_bytes * 10

    def for_workers(self) -> "ImageSource":
        return dataclasses.replace(self, items=())

    def work_items(self) -> list:
        return [(i, entries, None) for i, entries in enumerate(self.items)]

    def decided_types(self, type_counts, *, tolerance: float) -> dict:
        return {name: (dtype, tuple(shape)) for name, dtype, shape in self.arrow_types}

    def read(self, item: WorkItem) -> tuple:
        # An image item is a list of entries; bad ones name their own file.
        return self.input_pattern, image_records.iter_image_chunks(item[1], self.images, self.labels, self.extra_types)

    def type_chunk(self, path: str, chunk, types: dict) -> tuple:
        return type_arrow_chunk(self, path, chunk, types)

    def recorded(self) -> dict:
        return {"image": self.images.recorded()}

    def metadata(self, counters: dict) -> dict:
        formats = {k.split(":", 1)[1]: v for k, v in sorted(counters.items()) if k.startswith("format:")}
        actions = {k: v for k, v in sorted(counters.items()) if not k.startswith("format:")}
        return {
            "feature": self.binary_columns[0],
            "stored": self.images.recorded(),
            "formats": formats,
            "actions": actions,
        }

    @property
    def vocabulary(self) -> tuple:
        return self.labels

    def role(self, column: str, label: str | None) -> str | None:
        return "image" if column in self.binary_columns else super().role(column, label)
