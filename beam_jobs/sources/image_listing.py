"""Launch-time listing of an image corpus: a class-per-folder tree or a manifest.

Both give ImageEntry lists, a sorted label vocabulary and work items of bounded size
(the unit a worker converts). Paths may be local or gs://; the files themselves are
read by the workers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import logging
import os
import posixpath
import stat

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import is_denied, storage_error
from beam_jobs.sources import column_types, readers
from beam_jobs.sources.image_records import IMAGE_COLUMNS, ImageEntry

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
    """`root/<label>/<file>`: every image file one level below root; the folder is the label.

    A link that cannot be followed (dangling, or a loop) where a label folder or an image
    file would be, and a special file with an image name become entries that are
    quarantined as `unreadable`, never silently left out. A folder that cannot be listed
    or a file the job may not read stops the job instead: a folder's images cannot be
    counted against --max_bad_fraction, and access is the environment's to fix, not the record's.
    """
    root = root.rstrip("/")
    found = _local_tree(root) if FileSystems.get_scheme(root) is None else _remote_tree(root)
    prefix = root + "/"
    entries, sizes, skipped = [], [], 0
    for path, size, problem in sorted(found):
        rel = path[len(prefix) :] if path.startswith(prefix) else path
        parts = rel.split("/")
        if problem is not None and len(parts) == 1:  # a label folder's link that cannot be followed
            entries.append(ImageEntry(path=path, name=rel, label=None, problem=("unreadable", problem)))
            sizes.append(0)
            continue
        if len(parts) != 2 or not rel.lower().endswith(IMAGE_EXTENSIONS) or size is None and problem is None:
            skipped += 1
            continue
        problem = None if problem is None else ("unreadable", problem)
        entries.append(ImageEntry(path=path, name=rel, label=parts[0], problem=problem))
        sizes.append(size or 0)
    if skipped:
        logger.info(
            "skipped %d file(s) or folder(s) under %s that are not <label>/<file> with an image extension %s",
            skipped,
            root,
            IMAGE_EXTENSIONS,
        )
    if not entries:
        raise ImageInputError(
            f"no image files found as {root}/<label>/<file> (extensions {', '.join(IMAGE_EXTENSIONS)}); "
            "give a class-per-folder tree or a manifest (.csv or .parquet) with --input"
        )
    labels = _sort_labels(e.label for e in entries if e.label is not None)
    return ImageCorpus(tuple(entries), labels, (), sum(sizes), tuple(sizes))


def _remote_tree(root: str) -> list:
    """(path, size, None) of the objects matching root/*/* (object stores have no links)."""
    try:
        found = [m for r in FileSystems.match([FileSystems.join(root, "*", "*")]) for m in r.metadata_list]
    except Exception as e:
        raise storage_error("list", "--input", root, e, ImageInputError) from e
    return [(m.path, m.size_in_bytes, None) for m in found]


def _local_tree(root: str) -> list:
    """(path, size or None, problem or None) of what lies one and two levels below root.

    Beam's local listing silently drops what it cannot stat (a dangling link, a link
    loop) and never enters a linked folder; this one follows links to folders and
    files, and reports the ones it cannot follow. Size is None for folders and problems.
    """
    try:
        top = list(os.scandir(root))
    except PermissionError as e:
        raise storage_error("list", "--input", root, e, ImageInputError) from e
    except OSError as e:
        raise ImageInputError(f"cannot list --input {root}: {e.strerror}") from e
    out = []
    for label in top:
        mode, problem = _follow(label.path)
        if not stat.S_ISDIR(mode):  # a root-level file, or a link that cannot be followed
            out.append((label.path, None, problem))
            continue
        try:
            children = list(os.scandir(label.path))
        except PermissionError as e:  # how many images it holds is unknown: no quarantine can stand for them
            raise storage_error("list", "--input", label.path, e, ImageInputError) from e
        except OSError as e:
            raise ImageInputError(
                f"cannot list label folder {label.path}: {e.strerror}; repair it or move it out of --input"
            ) from e
        for child in children:
            mode, problem = _follow(child.path)
            if problem is None and stat.S_ISREG(mode):
                out.append((child.path, os.stat(child.path).st_size, None))
            elif problem is None and not stat.S_ISDIR(mode):  # a FIFO would block its reader
                out.append((child.path, None, f"{child.path} is not a regular file"))
            else:
                out.append((child.path, None, problem))
    return out


def _follow(path: str) -> tuple:
    """(st_mode after following links, None), or (0, why the path cannot be followed);
    a refused permission raises, since granting access, not quarantine, is the fix."""
    try:
        return os.stat(path).st_mode, None
    except PermissionError as e:
        raise storage_error("read", "--input", path, e, ImageInputError) from e
    except OSError as e:
        if not os.path.islink(path):
            return 0, f"cannot read {path}: {e.strerror}"
        target = os.readlink(path)
        if e.errno == errno.ELOOP:
            return 0, f"symbolic link loop: {path} -> {target} leads back to itself"
        if e.errno == errno.ENOENT:
            return 0, f"dangling symbolic link: {path} -> {target}, which does not exist"
        return 0, f"symbolic link {path} -> {target} cannot be followed: {e.strerror}"


def _read_table(path: str) -> pa.Table:
    try:
        if path.lower().endswith(".parquet"):
            with readers.open_parquet(path) as f:
                return pq.read_table(f)
        with readers.CsvInput(path) as stream:  # gzip decoded by Arrow, as for CSV corpora
            return pacsv.read_csv(stream)
    except Exception as e:
        if is_denied(e):
            raise storage_error("read", "--input", path, e, ImageInputError) from e
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
            column_types.arrow_dtype(c, t)
        except ValueError as e:
            raise ImageInputError(f"manifest {path}: {e}") from None
        extra_types.append((c, t))
    base = path.rsplit("/", 1)[0] if "/" in path else "."
    paths = table.column(path_column).cast(pa.string()).to_pylist()
    labels = table.column(label_column).cast(pa.string()).to_pylist()
    extra_values = [table.column(c).to_pylist() for c in extras]
    first_row = 1 if path.lower().endswith(".parquet") else 2  # a CSV header is row 1
    unfit = _unfit_extras(table, extras, path, first_row)
    entries = []
    for i, (p, label) in enumerate(zip(paths, labels)):
        p = (p or "").strip()
        full = p if (not p or "://" in p or posixpath.isabs(p)) else FileSystems.join(base, p)
        label = label.strip() if isinstance(label, str) else None
        entries.append(
            ImageEntry(
                path=full or f"{path}:row {i + first_row}",
                name=p,
                label=label or None,
                extras=tuple(v[i] for v in extra_values),
                problem=("type", unfit[i]) if i in unfit else None,
            )
        )
    if not entries:
        raise ImageInputError(f"manifest {path} has no rows")
    vocabulary = _sort_labels(e.label for e in entries if e.label)
    return ImageCorpus(tuple(entries), vocabulary, tuple(extra_types), _estimate_bytes(entries))


def _unfit_extras(table: pa.Table, extras: list, path: str, first_row: int) -> dict:
    """Row -> why one of its extra values cannot be stored (its image is quarantined)."""
    unfit: dict = {}
    for c in extras:
        found: list = []
        try:
            column_types.canonical_arrow_column(table.column(c), c, unfit=found)
        except column_types.UnstorableValue as e:
            row = "" if e.index is None else f", row {e.index + first_row}"
            raise ImageInputError(f"manifest {path}{row}: {e}") from None
        for i, reason in found:
            unfit.setdefault(i, reason)
    return unfit


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
