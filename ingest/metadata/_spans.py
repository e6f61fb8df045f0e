"""Several converted datasets read as one: spans of daily data, a glob, or a list.

A daily pipeline converts each day once into its own directory (a *span*, as TFX calls
it) and trains on the latest N. Reading them as one dataset needs one view of their
metadata: the features (which must agree), every split's shards (each named from a
common root, so every reader that joins `path/filename` reads the right file) and their
statistics merged as if the rows had been converted together.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re

from ingest import contract, statistics

__all__ = ["spans", "resolve", "Spans", "merged"]

logger = logging.getLogger(__name__)

_GLOB_CHARS = frozenset("*?[")
FIX = "Convert every span with --schema_from one of them, so that they share one schema"


def _gfile():
    from ingest.metadata import _files  # local paths without TensorFlow: listing spans needs none

    return _files


def _has_metadata(path: str) -> bool:
    return _gfile().exists(f"{path}/{contract.METADATA_FILENAME}")


# A date in a span's name: 2026-11-27, 2026_11_27, 2026.11.27, 20261127; or a month, 2026-11.
_DATE = re.compile(r"(?<!\d)(\d{4})(?:([-_.])(\d{1,2})(?:\2(\d{1,2}))?|(\d{2})(\d{2}))(?!\d)")


def date_in(name: str) -> tuple | None:
    """(year, month, day) of the last valid date in `name` (day 0 for a month: 2026-11);
    None without one. 8 digits count only as a valid date (20261127, not 12345678)."""
    found = None
    for m in _DATE.finditer(name):
        year, sep, month, day, month8, day8 = m.groups()
        y, mo, d = (int(year), int(month8), int(day8)) if sep is None else (int(year), int(month), int(day or 0))
        try:
            datetime.date(y, mo, d or 1)
        except ValueError:
            continue
        found = (y, mo, d)
    return found


def ordered(paths: list) -> list:
    """Span paths oldest first: by the date in their names when every name has one (so
    2026-11-3, 20261127 and backfill-2026-11-20 fall in date order), else by name."""
    dates = {p: date_in(p.rstrip("/").rsplit("/", 1)[-1]) for p in paths}
    if all(dates.values()):
        return sorted(paths, key=lambda p: (dates[p], p))
    dated = [p for p in paths if dates[p]]
    if dated:
        logger.warning(
            "spans ordered by name, not by date: %s have no date in their names (%s, ...)",
            ", ".join(sorted(p for p in paths if not dates[p])),
            dated[0],
        )
    return sorted(paths)


def spans(root, *, last: int | None = None) -> list:
    """The span directories under `root` (those holding a finished dataset), oldest first:
    by the date in their names when each has one (2026-11-27, 20261127, 2026-11), else by
    name; the `last` N of them when given.

    A directory whose conversion has not finished (no metadata yet, as while today's span
    is being written) is left out, with a log line naming it: training never reads half a span.
    """
    root = str(root).rstrip("/")
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 1):
        raise ValueError(f"last must be a positive integer or None (every span), got {last!r}")
    gfile = _gfile()
    if not gfile.isdir(root):
        if gfile.exists(root):
            raise FileNotFoundError(f"{root} is a file, not a directory of spans: give the directory holding them")
        raise FileNotFoundError(f"no span directory at {root}: the directory does not exist")
    children = sorted(c.rstrip("/") for c in gfile.listdir(root))
    found, unfinished = [], []
    for child in children:
        path = f"{root}/{child}"
        if _has_metadata(path):
            found.append(path)
        elif gfile.isdir(path) and not child.startswith((".", "_")):
            unfinished.append(child)
    if unfinished:
        logger.warning(
            "spans under %s without %s (not converted, or still converting) are left out: %s",
            root,
            contract.METADATA_FILENAME,
            ", ".join(unfinished),
        )
    if not found:
        raise FileNotFoundError(
            f"no converted dataset under {root}: each span is a directory that a conversion wrote "
            f"(holding {contract.METADATA_FILENAME}), e.g. {root}/2026-11-25"
        )
    return _distinct(ordered(found), last)


def _distinct(found: list, last: int | None) -> list:
    """The `last` spans of `found` that are distinct datasets: a link to a span (`latest`) or a
    copy of one (the same conversion's job id) is the span once, under its own name.

    Only as many metadata files are read as it takes to find `last` distinct spans.
    """
    targets = {_real(p) for p in found if not _is_link(p)}
    # A link whose target is a span of the list is that span: left out without reading anything.
    links = [p for p in found if _is_link(p) and _real(p) in targets]
    kept, by_job, twice = [], {}, [f"{p} (a link to {_real(p)})" for p in links]
    for path in reversed([p for p in found if p not in links]):
        if last is not None and len(kept) == last:
            break
        job = _job_of(path)
        if job in by_job:  # the copy named later stands for the span under its first name
            twice.append(f"{by_job[job]} (a copy of {path}: both were written by conversion {job})")
            kept[kept.index(by_job[job])] = path
            by_job[job] = path
            continue
        kept.append(path)
        if job is not None:
            by_job[job] = path
    if twice:
        logger.warning(
            "spans that are a span already listed are left out (each span is read once): %s", "; ".join(twice)
        )
    held = set(kept)
    return [p for p in found if p in held]  # in the order found, oldest first


def _is_link(path: str) -> bool:
    return "://" not in path and os.path.islink(path)


def _real(path: str) -> str:
    """Where a path leads once its links are followed (object storage has none)."""
    return _key(path) if "://" in path else os.path.realpath(path)


def _job_of(path: str) -> str | None:
    """The id of the conversion that wrote the dataset at `path`, from its metadata; None
    where there is none (older conversions) or the file cannot be parsed (reading it says why)."""
    try:
        source = json.loads(_gfile().read_bytes(f"{path}/{contract.METADATA_FILENAME}")).get("source")
    except (ValueError, AttributeError, OSError):
        return None
    job = source.get("job") if isinstance(source, dict) else None
    return job if isinstance(job, str) and job else None


def resolve(path) -> tuple:
    """A dataset path, a glob of them, or a list of either -> the dataset paths, in order."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise ValueError("an empty list of datasets: give at least one path")
        out = []
        for p in path:
            if isinstance(p, (list, tuple)):
                raise ValueError(f"a list of datasets holds paths, not lists: got {p!r}")
            out.extend(resolve(p))
        keys = [_key(p) for p in out]
        twice = sorted({p for p, k in zip(out, keys) if keys.count(k) > 1})
        if twice:
            raise ValueError(
                f"dataset(s) {twice} name the same dataset more than once: each span would be read twice an epoch"
            )
        return tuple(out)
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a dataset directory, a glob of them or a list, got {path!r}")
    path = os.fspath(path).rstrip("/")
    if not _GLOB_CHARS & set(path) or _has_metadata(path):
        return (path,)
    matches = sorted(m.rstrip("/") for m in _gfile().glob(path))
    found = [m for m in matches if _has_metadata(m)]
    left = [m for m in matches if m not in found and _gfile().isdir(m)]
    if left:
        logger.warning(
            "%d match(es) of %s hold no %s (not converted, or still converting) and are left out: %s",
            len(left),
            path,
            contract.METADATA_FILENAME,
            ", ".join(left),
        )
    if not found:
        raise FileNotFoundError(
            f"no converted dataset matches {path}"
            + (f" ({len(matches)} match(es), none holding {contract.METADATA_FILENAME})" if matches else "")
        )
    return tuple(found)


def _key(path: str) -> str:
    """A dataset path as one spelling: './d', 'd', '/abs/d' and 'x/../d' name one directory."""
    if "://" in path:
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{'/'.join(part for part in rest.split('/') if part)}"
    return os.path.normpath(os.path.abspath(path))


@dataclasses.dataclass(frozen=True)
class Spans:
    """Datasets read as one: `info` names every shard from `root`."""

    root: str
    paths: tuple
    infos: tuple
    info: contract.DatasetInfo


def _under(rel: str, shard: contract.ShardInfo) -> contract.ShardInfo:
    """A span's shard named from the common root: its file and its block index."""
    if not rel:
        return shard
    index = f"{rel}/{shard.index}" if shard.index is not None else None
    return dataclasses.replace(shard, filename=f"{rel}/{shard.filename}", index=index)


def merged(paths: tuple, infos: tuple) -> Spans:
    """One view of the datasets at `paths` (with their metadata), after checking they agree."""
    if len(paths) == 1:
        return Spans(paths[0], paths, infos, infos[0])
    _check_distinct(paths, infos)
    _check_agree(paths, infos)
    root, relative = _common_root(paths)
    first = infos[0]
    features = tuple(
        dataclasses.replace(
            f,
            missing=sum(i.feature(f.name).missing for i in infos),
            min_length=_extreme(min, [i.feature(f.name).min_length for i in infos]),
            max_length=_extreme(max, [i.feature(f.name).max_length for i in infos]),
        )
        for f in first.features
    )
    split_names = list(dict.fromkeys(s.name for i in infos for s in i.splits))
    splits = tuple(
        contract.SplitInfo(
            name,
            tuple(
                _under(rel, shard)
                for rel, info in zip(relative, infos)
                for s in info.splits
                if s.name == name
                for shard in s.shards
            ),
        )
        for name in split_names
    )
    stats = [i.statistics for i in infos]
    info = dataclasses.replace(
        first,
        features=features,
        splits=splits,
        # The conversions' ids: a checkpoint or an offsets cache of other spans never matches.
        source={"spans": list(paths), "job": "+".join(str(i.source.get("job", "")) for i in infos)},
        options={},
        quarantine={"records": sum(int((i.quarantine or {}).get("records", 0) or 0) for i in infos)},
        created=max(i.created for i in infos),
        warnings=tuple(f"{p}: {w}" for p, i in zip(paths, infos) for w in i.warnings),
        statistics=None if any(s is None for s in stats) else statistics.merge(stats),
        # A text label's class ids mean the same in every span only if their classes agree.
        labels=first.labels if all(i.labels == first.labels for i in infos) else (),
        vocabularies=_longest_vocabularies(relative, infos),
        image=_merged_image(infos),
    )
    return Spans(root, paths, infos, info)


def _longest_vocabularies(relative: tuple, infos: tuple) -> dict:
    """Each feature every span has a vocabulary of: the longest (the latest span's, carried
    and extended by --schema_from), named from the common root."""
    out = {}
    for name in set.intersection(*(set(i.vocabularies) for i in infos)):
        size, rel, entry = max((i.vocabularies[name]["size"], r, i.vocabularies[name]) for r, i in zip(relative, infos))
        out[name] = {**entry, "file": f"{rel}/{entry['file']}" if rel else entry["file"]}
    return out


def _merged_image(infos) -> dict:
    """The first span's image metadata with every span's stored formats: the decoder picks its
    path from them (a span of raw pixels read with one of JPEGs needs both)."""
    first = dict(infos[0].image or {})
    if not first:
        return first
    formats = {}
    if not all((info.image or {}).get("formats") for info in infos):
        return {**first, "formats": {}}  # a span that does not say: every image takes the general decoder
    for info in infos:
        for name, count in info.image["formats"].items():
            formats[name] = formats.get(name, 0) + count
    return {**first, "formats": formats}


def _extreme(pick, values):
    return None if any(v is None for v in values) else pick(values)


def _described(f: contract.FeatureSpec) -> str:
    shape = "scalar" if f.is_scalar else ("variable-length list" if f.is_variable_length else f"list of {f.shape[0]}")
    role = f", {f.role}" if f.role else ""
    return f"{f.dtype} {shape}" + (", text" if f.text else "") + f", default {f.default!r}{role}"


def _check_distinct(paths: tuple, infos: tuple) -> None:
    """Refuses one dataset reached under two names (a link to it, a copy of it): its rows
    would be read twice an epoch and counted twice in the statistics."""
    seen = {}
    for path, info in zip(paths, infos):
        job = str(info.source.get("job") or "")
        for key, how in ((_real(path), f"both lead to {_real(path)}"), (job, f"both were written by conversion {job}")):
            if key and key in seen:
                raise ValueError(
                    f"datasets {seen[key]} and {path} are the same dataset ({how}): its rows would be read twice "
                    "an epoch. Leave one of them out (ingest.spans leaves out links to and copies of a span)"
                )
            seen[key] = path


def _check_agree(paths: tuple, infos: tuple) -> None:
    """Refuses datasets that cannot be read as one, naming the dataset and what differs."""
    first, base = infos[0], paths[0]
    for path, info in zip(paths[1:], infos[1:]):
        names, base_names = [f.name for f in info.features], [f.name for f in first.features]
        if names != base_names:
            extra = [n for n in names if n not in base_names]
            lost = [n for n in base_names if n not in names]
            raise ValueError(
                f"datasets {base} and {path} have different features"
                + (f": {path} has {extra} that {base} has not" if extra else "")
                + (f"{';' if extra else ':'} {path} lacks {lost}" if lost else "")
                + ("" if extra or lost else f" in another order ({names} against {base_names})")
                + f". Read them separately, or {FIX[0].lower() + FIX[1:]}"
            )
        for what, mine, theirs in (
            ("label", info.label, first.label),
            ("layout", info.layout, first.layout),
            ("block_rows", info.block_rows, first.block_rows),
            ("compression", info.compression, first.compression),
            ("image feature", (info.image or {}).get("feature"), (first.image or {}).get("feature")),
        ):
            if mine != theirs:
                how = FIX if what == "label" else "Reconvert one with the other's options"
                raise ValueError(f"datasets {base} and {path} differ in {what}: {theirs!r} and {mine!r}. {how}")
        for f in info.features:
            g = first.feature(f.name)
            if (f.dtype, f.shape, f.default, f.text, f.role) != (g.dtype, g.shape, g.default, g.text, g.role):
                raise ValueError(
                    f"feature {f.name!r} is {_described(f)} in {path} but {_described(g)} in {base}: the spans "
                    f"would yield different tensors. {FIX}"
                )


def _common_root(paths: tuple) -> tuple:
    """The deepest directory holding every path, and each path relative to it."""
    paths = [p if "://" in p else os.path.abspath(p) for p in paths]
    schemes = {p.split("://")[0] if "://" in p else "" for p in paths}
    if len(schemes) > 1:
        raise ValueError(f"datasets on different filesystems cannot be read as one: {list(paths)}")
    parts = [p.split("/") for p in paths]
    common = []
    for pieces in zip(*parts):
        if len(set(pieces)) > 1:
            break
        common.append(pieces[0])
    return "/".join(common), ["/".join(p[len(common) :]) for p in parts]
