"""Launch-time listing of an image corpus: a class-per-folder tree or a manifest.

Both give ImageEntry lists, a sorted label vocabulary and work items of bounded size
(the unit a worker converts). Paths may be local or gs://; the files themselves are
read by the workers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import posixpath

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from beam_jobs import _sources, _typing
from beam_jobs._images import IMAGE_COLUMNS, ImageEntry

__all__ = ["ImageCorpus", "is_manifest", "list_folder", "read_manifest", "work_items", "IMAGE_EXTENSIONS"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
_MANIFEST_EXTENSIONS = (".csv", ".csv.gz", ".parquet")
# Work item bounds: enough items to spread over workers, few enough to keep per-item overhead low.
ITEM_IMAGES = 128
ITEM_BYTES = 64 << 20
_SIZE_SAMPLE = 64  # manifest images whose size is looked up to estimate the corpus size


@dataclasses.dataclass(frozen=True)
class ImageCorpus:
    entries: tuple  # ImageEntry, in listing order
    vocabulary: tuple  # label names; the label index is the position
    extra_types: tuple  # manifest extras: ((name, pyarrow type), ...)
    input_bytes: int  # measured (folders) or estimated from a sample (manifests)
    sizes: tuple = ()  # bytes per entry when known


class ImageInputError(ValueError):
    pass


def is_manifest(path: str) -> bool:
    return path.lower().endswith(_MANIFEST_EXTENSIONS)


def _sort_labels(labels) -> tuple:
    labels = set(labels)
    if all(s.lstrip("-").isdigit() for s in labels):  # numeric class ids: 2 before 10
        return tuple(sorted(labels, key=int))
    return tuple(sorted(labels))


def list_folder(root: str) -> ImageCorpus:
    """`root/<label>/<file>`: every image file one level below root; the folder is the label."""
    root = root.rstrip("/")
    try:
        found = [m for r in FileSystems.match([FileSystems.join(root, "*", "*")]) for m in r.metadata_list]
    except Exception as e:
        raise ImageInputError(f"cannot list --input {root}: {e}") from e
    prefix = root + "/"
    entries, sizes, skipped = [], [], 0
    for m in sorted(found, key=lambda m: m.path):
        rel = m.path[len(prefix):] if m.path.startswith(prefix) else m.path
        parts = rel.split("/")
        if len(parts) != 2 or not rel.lower().endswith(IMAGE_EXTENSIONS):
            skipped += 1
            continue
        entries.append(ImageEntry(path=m.path, name=rel, label=parts[0]))
        sizes.append(m.size_in_bytes)
    if skipped:
        logger.info("skipped %d file(s) under %s without an image extension %s", skipped, root, IMAGE_EXTENSIONS)
    if not entries:
        raise ImageInputError(
            f"no image files found as {root}/<label>/<file> (extensions {', '.join(IMAGE_EXTENSIONS)}); "
            "give a class-per-folder tree or a manifest (.csv or .parquet) with --input"
        )
    return ImageCorpus(tuple(entries), _sort_labels(e.label for e in entries), (), sum(sizes), tuple(sizes))


def _read_table(path: str) -> pa.Table:
    try:
        if path.lower().endswith(".parquet"):
            with _sources.open_parquet(path) as f:
                return pq.read_table(f)
        with _sources.CsvInput(path) as stream:  # gzip decoded by Arrow, as for CSV corpora
            return pacsv.read_csv(stream)
    except Exception as e:
        raise ImageInputError(f"cannot read manifest {path}: {e}") from e


def read_manifest(path: str, *, path_column: str, label_column: str, columns=None) -> ImageCorpus:
    """A CSV or Parquet table: one row per image, a path column, a label column, extras."""
    table = _read_table(path)
    names = table.column_names
    for flag, col in (("--path_column", path_column), ("--label", label_column)):
        if col not in names:
            raise ImageInputError(f"manifest {path} has no column {col!r} ({flag}); its columns: {names}")
    extras = [c for c in (columns if columns is not None else names) if c not in (path_column, label_column)]
    unknown = [c for c in extras if c not in names]
    if unknown:
        raise ImageInputError(f"--columns names {unknown}, which manifest {path} lacks; its columns: {names}")
    reserved = [c for c in extras if c in dict(IMAGE_COLUMNS)]
    if reserved:
        raise ImageInputError(f"manifest columns {reserved} clash with the image record's own features; rename them")
    extra_types = []
    for c in extras:
        t = table.schema.field(c).type
        try:
            _typing.arrow_dtype(c, t)
        except ValueError as e:
            raise ImageInputError(f"manifest {path}: {e}") from None
        extra_types.append((c, t))
    base = path.rsplit("/", 1)[0] if "/" in path else "."
    paths = table.column(path_column).cast(pa.string()).to_pylist()
    labels = table.column(label_column).cast(pa.string()).to_pylist()
    extra_values = [table.column(c).to_pylist() for c in extras]
    entries = []
    for i, (p, label) in enumerate(zip(paths, labels)):
        p = (p or "").strip()
        full = p if (not p or "://" in p or posixpath.isabs(p)) else FileSystems.join(base, p)
        label = label.strip() if isinstance(label, str) else None
        entries.append(ImageEntry(path=full or f"{path}:row {i + 2}", name=p, label=label or None,
                                  extras=tuple(v[i] for v in extra_values)))
    if not entries:
        raise ImageInputError(f"manifest {path} has no rows")
    vocabulary = _sort_labels(e.label for e in entries if e.label)
    return ImageCorpus(tuple(entries), vocabulary, tuple(extra_types), _estimate_bytes(entries))


def _estimate_bytes(entries) -> int:
    step = max(1, len(entries) // _SIZE_SAMPLE)
    sample = [e.path for e in entries[::step]][:_SIZE_SAMPLE]

    def size(p):
        try:
            return FileSystems.match([p])[0].metadata_list[0].size_in_bytes
        except Exception:  # unreadable entries are quarantined later; skip them here
            return None

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        known = [s for s in pool.map(size, sample) if s is not None]
    return int(sum(known) / len(known) * len(entries)) if known else 0


def work_items(corpus: ImageCorpus) -> list:
    """Entries grouped into items of at most ITEM_IMAGES images and about ITEM_BYTES."""
    items, current, held = [], [], 0
    sizes = corpus.sizes or (0,) * len(corpus.entries)
    for entry, size in zip(corpus.entries, sizes):
        current.append(entry)
        held += size
        if len(current) >= ITEM_IMAGES or held >= ITEM_BYTES:
            items.append(tuple(current))
            current, held = [], 0
    if current:
        items.append(tuple(current))
    return items
