"""The last step of a conversion: check, commit shards, write the metadata last.

Order matters: until the metadata file appears the directory is an incomplete dataset,
so a job that dies anywhere before the final rename leaves nothing that looks complete,
and a rerun cleans up and starts over.
"""

from __future__ import annotations

import datetime
import logging

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._config import JobConfig, decided_types
from ingest import contract

logger = logging.getLogger(__name__)


TMP_PREFIX = contract.TEMP_PREFIX


class ConversionError(RuntimeError):
    pass


def _join(base: str, name: str) -> str:
    return FileSystems.join(base, name)


def build_features(cfg: JobConfig, stats: dict, type_counts) -> tuple:
    types = decided_types(cfg, type_counts)
    features = []
    for name in cfg.columns:
        dtype, shape = types[name]
        features.append(
            contract.FeatureSpec(
                name=name,
                dtype=dtype,
                shape=shape,
                missing=int(stats["missing"].get(name, 0)),
                role="label" if name == cfg.label else ("image" if cfg.images and name in cfg.binary_columns else None),
                text=dtype == "bytes" and name not in cfg.binary_columns,
                min_length=stats["min_len"].get(name),
                max_length=stats["max_len"].get(name),
            )
        )
    return tuple(features)


def existing_dataset_files(output: str) -> list:
    """Files a previous conversion may have left in `output` (shards, quarantine, temp)."""
    patterns = [
        _join(output, "*.tfrecord"),
        _join(output, "*.tfrecord.gz"),
        _join(output, contract.QUARANTINE_DIRNAME + "/*"),
        _join(output, TMP_PREFIX + "*/**"),
    ]
    found = []
    for result in FileSystems.match(patterns):
        found.extend(m.path for m in result.metadata_list)
    return found


def _check_quality(cfg: JobConfig, stats: dict, quarantine: list) -> None:
    total, bad = stats["rows"], stats["bad"]
    where = f"{cfg.tmp_dir}/quarantine/"
    if total and bad / total > cfg.max_bad_fraction:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats["reasons"].items()))
        raise ConversionError(
            f"{bad} of {total} rows ({bad / total:.3%}) were quarantined ({reasons}), more than "
            f"--max_bad_fraction={cfg.max_bad_fraction}. No dataset was written. The bad rows, with "
            f"their source and reason, are in {where}. Fix the input, give column types with "
            f"--column NAME:TYPE, or raise --max_bad_fraction."
        )
    if total - bad == 0:
        raise ConversionError(
            f"no records were read from {cfg.input_pattern} ({cfg.input_count} {'image' if cfg.images else 'file'}(s)"
            + (f", {bad} rows quarantined in {where}" if bad else ", all empty")
            + "): refusing to write an empty dataset"
        )


def finalize_dataset(_, cfg: JobConfig, shards: list, stats: dict, quarantine: list, type_counts=None) -> str:
    _check_quality(cfg, stats, quarantine)
    features = build_features(cfg, stats, type_counts)
    metadata_path = _join(cfg.output, contract.METADATA_FILENAME)
    # From here on the directory is incomplete until the new metadata lands.
    if FileSystems.exists(metadata_path):
        FileSystems.delete([metadata_path])
    stale = [p for p in existing_dataset_files(cfg.output) if not p.startswith(cfg.tmp_dir)]
    if stale:
        FileSystems.delete(stale)

    splits = []
    sources, destinations = [], []
    for s, name in enumerate(cfg.split_names):
        mine = sorted((x for x in shards if x["split"] == s and x["records"] > 0), key=lambda x: x["shard"])
        infos = []
        for i, shard in enumerate(mine):
            filename = contract.shard_filename(name, i, len(mine), cfg.compression)
            sources.append(shard["path"])
            destinations.append(_join(cfg.output, filename))
            infos.append(contract.ShardInfo(filename, int(shard["records"]), int(shard["bytes"])))
        splits.append(contract.SplitInfo(name, tuple(infos)))
    quarantine_files = []
    for i, q in enumerate(sorted(quarantine, key=lambda q: q["path"])):
        rel = f"{contract.QUARANTINE_DIRNAME}/part-{i:05d}-of-{len(quarantine):05d}.jsonl"
        sources.append(q["path"])
        destinations.append(_join(cfg.output, rel))
        quarantine_files.append({"path": rel, "records": q["records"]})
    if quarantine_files:
        _mkdirs(_join(cfg.output, contract.QUARANTINE_DIRNAME))
    if sources:
        FileSystems.rename(sources, destinations)

    info = contract.DatasetInfo(
        features=features,
        splits=tuple(splits),
        compression=cfg.compression,
        label=cfg.label,
        source={
            "format": cfg.source_format,
            "input": cfg.input_pattern,
            "files": cfg.input_count,
            "bytes": cfg.input_bytes,
            "schema": cfg.schema_origin,
            "rows": stats["rows"],
        },
        options=cfg.recorded_options(),
        quarantine={
            "records": stats["bad"],
            "reasons": dict(sorted(stats["reasons"].items())),
            "path": contract.QUARANTINE_DIRNAME + "/",
            "files": quarantine_files,
        },
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        labels=cfg.vocabulary,
        image=_image_metadata(cfg, stats),
    )
    text = info.to_json()
    tmp_meta = _join(cfg.tmp_dir, contract.METADATA_FILENAME)
    with FileSystems.create(tmp_meta, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(text.encode("utf-8"))
    FileSystems.rename([tmp_meta], [metadata_path])
    delete_tree(cfg.tmp_dir)
    logger.info("wrote %s", metadata_path)
    return text


def _image_metadata(cfg: JobConfig, stats: dict) -> dict:
    if cfg.images is None:
        return {}
    counters = stats.get("counters", {})
    formats = {k.split(":", 1)[1]: v for k, v in sorted(counters.items()) if k.startswith("format:")}
    actions = {k: v for k, v in sorted(counters.items()) if not k.startswith("format:")}
    return {"feature": cfg.binary_columns[0], "stored": cfg.images.recorded(), "formats": formats, "actions": actions}


def _mkdirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except IOError:  # already there; object stores need none
        pass


def delete_tree(path: str) -> None:
    """Deletes every file under `path`, and `path` itself where directories exist."""
    files = [m.path for r in FileSystems.match([_join(path, "**")]) for m in r.metadata_list]
    if files:
        FileSystems.delete(files)
    if FileSystems.exists(path):  # local directories; object stores have none
        FileSystems.delete([path])
