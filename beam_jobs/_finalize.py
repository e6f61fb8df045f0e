"""The last step of a conversion: check, move shards into place, swap the metadata last.

Order matters: until the new metadata lands the directory holds the old dataset (or
none) whole, so a job that dies anywhere before it leaves nothing that looks complete
or newer than it is; `output_dir` says how a rerun finishes or undoes a dead job's commit.
"""

from __future__ import annotations

import datetime
import json
import logging

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._config import Decided, JobConfig
from beam_jobs._errors import ConversionError
from beam_jobs.output import directory as output_dir
from beam_jobs.stats.conversion import ConversionStats
from ingest import contract
from ingest.statistics import Statistics

logger = logging.getLogger(__name__)

TMP_PREFIX = contract.TEMP_PREFIX


def _join(base: str, name: str) -> str:
    return FileSystems.join(base, name)


def build_features(cfg: JobConfig, stats: ConversionStats, decided: Decided) -> tuple:
    defaults = cfg.defaults or {}  # a carried schema's; else each dtype's natural default
    features = []
    for name, (dtype, shape) in decided.types.items():
        features.append(
            contract.FeatureSpec(
                name=name,
                dtype=dtype,
                shape=shape,
                missing=int(stats.missing.get(name, 0)),
                default=defaults.get(name),
                role=cfg.source.role(name, cfg.label),
                text=dtype == "bytes" and name not in decided.binary,
                min_length=stats.min_len.get(name),
                max_length=stats.max_len.get(name),
            )
        )
    return tuple(features)


def _check_quality(cfg: JobConfig, stats: ConversionStats, quarantine: list) -> None:
    total, bad = stats.rows, stats.bad
    where = f"{cfg.tmp_dir}/quarantine/"
    source = cfg.source
    # A carried schema's types are not the input's to choose: no --column hint then.
    hint = source.quality_hint() if source.schema is None else "start a new schema (convert without --schema_from), "
    if total and bad / total > cfg.max_bad_fraction:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.reasons.items()))
        raise ConversionError(
            f"{bad} of {total} rows ({bad / total:.3%}) were quarantined ({reasons}), more than "
            f"--max_bad_fraction={cfg.max_bad_fraction}. No dataset was written. The bad rows, with "
            f"their source and reason, are in {where}{_first_bad(quarantine)}. Fix the input, {hint}"
            "or raise --max_bad_fraction."
        )
    if total - bad == 0:
        raise ConversionError(
            f"no records were read from {source.input_pattern} ({source.input_count} {source.unit}(s)"
            + (f", {bad} rows quarantined in {where}" if bad else ", all empty")
            + "): refusing to write an empty dataset"
        )


def _first_bad(quarantine: list) -> str:
    """', e.g. FILE, row N: REASON' from the first quarantine file, so that the error alone
    shows what was wrong; '' if it cannot be read (the directory is still named)."""
    for part in sorted(quarantine, key=lambda q: q["path"]):
        try:
            with FileSystems.open(part["path"], compression_type=CompressionTypes.UNCOMPRESSED) as f:
                first = json.loads(f.readline())
        except (OSError, ValueError):
            continue
        return f", e.g. {first.get('source')}, row {first.get('row')}: {first.get('reason')}"
    return ""


def finalize_dataset(
    _, cfg: JobConfig, shards: list, stats: ConversionStats, quarantine: list, type_counts=None, *, vocabularies=None
) -> str:
    """Commits the dataset; safe to run again after a failure at any point (runners retry).

    The plan (moves, metadata text, old files) is written to the temp dir once and every
    retry carries out that same plan: a move whose source is gone and whose destination
    exists was done already, and the metadata is swapped only after every shard is in place.
    """
    metadata_path = _join(cfg.output, contract.METADATA_FILENAME)
    if not FileSystems.exists(_join(cfg.tmp_dir, output_dir.JOB_FILE)):
        if FileSystems.exists(metadata_path):
            done = output_dir.read_text(metadata_path)
            if contract.DatasetInfo.from_json(done).source.get("job") == cfg.job_id:
                return done  # a retry after this job's commit had finished
        raise ConversionError(
            f"this job's temp dir {cfg.tmp_dir}/ was removed while it ran; no dataset was written. "
            "Rerun the conversion, and let no other process clean the output directory meanwhile"
        )
    plan_path = _join(cfg.tmp_dir, output_dir.COMMIT_FILE)
    if FileSystems.exists(plan_path):
        plan = json.loads(output_dir.read_text(plan_path))
    else:
        plan = _commit_plan(cfg, shards, stats, quarantine, type_counts, vocabularies or {})
        output_dir.write_text(plan_path, json.dumps(plan))
    _move_into_place(cfg, plan["moves"])
    if not (FileSystems.exists(metadata_path) and output_dir.read_text(metadata_path) == plan["metadata"]):
        output_dir.write_text(_join(cfg.tmp_dir, contract.METADATA_FILENAME), plan["metadata"])
        FileSystems.rename([_join(cfg.tmp_dir, contract.METADATA_FILENAME)], [metadata_path])
    # The new dataset is complete: only now do the old one's files go.
    new_files = {rel for _, rel in plan["moves"]}
    doomed = [rel for rel in plan["old_files"] if rel not in new_files]
    output_dir.delete_dataset_files(cfg.output, doomed, listed_in=plan_path)
    output_dir.remove_temp_dir(cfg.tmp_dir)
    for name in plan["empty_splits"]:
        logger.warning("split %r received no records; it is recorded in %s with none", name, metadata_path)
    logger.info("wrote %s", metadata_path)
    return plan["metadata"]


def _split_infos(cfg: JobConfig, shards: list, fresh) -> tuple:
    """The splits' shard infos, the (written, final name) moves that make them, and the
    names of the splits that received no records."""
    splits, moves, empty = [], [], []
    for s, name in enumerate(cfg.split_names):
        mine = sorted((x for x in shards if x["split"] == s and x["records"] > 0), key=lambda x: x["shard"])
        infos = []
        for i, shard in enumerate(mine):
            filename = fresh(contract.shard_filename(name, i, len(mine), cfg.compression))
            moves.append((shard["path"], filename))
            # The block index takes its shard's name: fresh when the shard's is.
            index = contract.index_filename(filename) if shard.get("index") else None
            if index is not None:
                moves.append((shard["index"], index))
            blocks = shard.get("blocks")
            infos.append(
                contract.ShardInfo(
                    filename, int(shard["records"]), int(shard["bytes"]), blocks, index, shard.get("fingerprint")
                )
            )
        splits.append(contract.SplitInfo(name, tuple(infos)))
        if not infos:
            empty.append(name)
    return splits, moves, empty


def _commit_plan(
    cfg: JobConfig, shards: list, stats: ConversionStats, quarantine: list, type_counts, vocabularies: dict
) -> dict:
    _check_quality(cfg, stats, quarantine)
    decided = cfg.decide(type_counts)
    features = build_features(cfg, stats, decided)
    metadata_path = _join(cfg.output, contract.METADATA_FILENAME)
    old = set()
    if FileSystems.exists(metadata_path):
        old = set(output_dir.dataset_files(contract.DatasetInfo.from_json(output_dir.read_text(metadata_path))))
        output_dir.refuse_undeletable(cfg.output, sorted(old), listed_in=metadata_path)
    # New files never take an old file's name, so the old dataset stays whole until the swap.
    tag = cfg.job_id[:8]

    def fresh(name: str) -> str:
        if name not in old:
            return name
        stem, dot, ext = name.partition(".")
        return f"{stem}-{tag}{dot}{ext}"

    splits, moves, empty = _split_infos(cfg, shards, fresh)
    quarantine_files = _quarantine_files(quarantine, fresh)
    moves += [(q["from"], q["path"]) for q in quarantine_files]
    files, vocabulary_warnings = _vocabulary_files(cfg, features, vocabularies, fresh)
    moves += [(path, entry["file"]) for path, entry in files.values()]
    output_dir.refuse_links_out(cfg.output, [rel for _, rel in moves])
    statistics = Statistics.from_json(stats.statistics_json(cfg.split_names)) if cfg.statistics else None
    schema = cfg.source.schema
    if schema is None:
        classes, label_warnings = _label_classes(cfg.label, features, statistics, stats)
    else:
        classes, label_warnings = _carried_classes(cfg.label, features, schema)
    info = contract.DatasetInfo(
        features=features,
        splits=tuple(splits),
        compression=cfg.compression,
        label=cfg.label,
        source={
            "format": cfg.source_format,
            "input": cfg.source.input_pattern,
            "files": cfg.source.input_count,
            "bytes": cfg.source.input_bytes,
            "schema": cfg.source.schema_origin,
            **({"schema_from": schema.provenance()} if schema is not None else {}),
            "rows": stats.rows,
            "job": cfg.job_id,
        },
        options=cfg.recorded_options(decided),
        quarantine={
            "records": stats.bad,
            "reasons": dict(sorted(stats.reasons.items())),
            "path": contract.QUARANTINE_DIRNAME + "/",
            "files": [{"path": q["path"], "records": q["records"]} for q in quarantine_files],
        },
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        labels=cfg.source.vocabulary or classes,
        image=cfg.source.metadata(stats.counters),
        warnings=tuple(f"split {name!r} received no records" for name in empty)
        + label_warnings
        + vocabulary_warnings
        + _bent_warnings(stats),
        layout=cfg.layout,
        block_rows=cfg.block_rows,
        statistics=statistics,
        vocabularies={name: entry for name, (_, entry) in files.items()},
    )
    return {"moves": moves, "metadata": info.to_json(), "old_files": sorted(old), "empty_splits": empty}


def _bent_warnings(stats: ConversionStats) -> tuple:
    """A warning per float32 feature whose type was given or carried and changed values
    (an inferred one never does: float64 then), logged and kept in the metadata."""
    out = []
    for name, (n, change) in sorted(stats.bent.items()):
        out.append(
            f"feature {name!r}: float32 changed {n:,} value{'s' * (n != 1)}, the largest by {change:.6g} "
            f"(float32 keeps about 7 significant digits); give it float64 (--column {name}:float64, or a "
            "schema with float64) to store them exactly"
        )
        logger.warning("%s", out[-1])
    return tuple(out)


def _quarantine_files(quarantine: list, fresh) -> list:
    """Each quarantine file of the job's bundles: where it is, the name it takes, its records."""
    ordered = sorted(quarantine, key=lambda q: q["path"])
    return [
        {"from": q["path"], "path": fresh(f"{contract.QUARANTINE_DIRNAME}/part-{i:05d}-of-{len(ordered):05d}.jsonl")}
        | {"records": q["records"]}
        for i, q in enumerate(ordered)
    ]


def _vocabulary_files(cfg: JobConfig, features: tuple, vocabularies: dict, fresh) -> tuple:
    """Writes each vocabulary to the temp dir as a JSON list: ({feature: (temp path, its
    metadata entry)}, the warnings of features without one or with values left out)."""
    files, warnings = {}, []
    for position, f in enumerate(features):
        v = vocabularies.get(f.name)
        if v is None:
            continue
        if v["note"]:
            unused = "" if v["values"] is not None else "; it has no vocabulary: make_dataset(text='ids') refuses it"
            warnings.append(f"text feature {f.name!r}: {v['note']}{unused}")
        if v["values"] is None:
            continue
        # Text features hold UTF-8 only (the sources quarantine what is not); surrogateescape
        # would keep a stray byte as \udcXX, which load refuses (`contract.parse_vocabulary`).
        values = [b.decode("utf-8", "surrogateescape") for b in v["values"].to_pylist()]
        rel = fresh(contract.vocabulary_filename(position))
        path = _join(cfg.tmp_dir, rel)
        text = json.dumps(values)  # ASCII
        output_dir.write_text(path, text)
        files[f.name] = (path, contract.vocabulary_entry(rel, text.encode("utf-8"), len(values)))
    return files, tuple(warnings)


def _label_classes(label: str | None, features: tuple, statistics: Statistics | None, stats) -> tuple:
    """A text label's classes, sorted (the runtime yields each as its index), from its exact
    counts (`stats`, the conversion's: the metadata's statistics keep the 1,000 most frequent
    values only, and a label of up to EXACT_VALUES classes has them all); and the warning to
    record where they cannot be had."""
    spec = next((f for f in features if f.name == label), None)
    if spec is None or not (spec.text and spec.is_scalar):
        return (), ()
    vocabulary = stats.distinct_values(label) if statistics is not None else None
    if vocabulary is None:
        why = "--no_statistics" if statistics is None else "more distinct values than are counted exactly"
        return (), (f"text label {label!r}: its classes are not recorded ({why}); make_dataset yields it as text",)
    return tuple(sorted(str(v) for v in vocabulary)), ()


def _carried_classes(label: str | None, features: tuple, schema) -> tuple:
    """A carried text label's classes: the schema's, as they are, so that a class id means
    the same class in every span (values that are none of them were quarantined)."""
    spec = next((f for f in features if f.name == label), None)
    if spec is None or not (spec.text and spec.is_scalar) or schema.labels:
        return schema.labels, ()
    return (), (
        f"text label {label!r}: its classes are not recorded, as --schema_from {schema.dataset} records none; "
        "make_dataset yields it as text",
    )


def _move_into_place(cfg: JobConfig, moves: list) -> None:
    sources, destinations = [], []
    for src, rel in moves:
        dst = _join(cfg.output, rel)
        if FileSystems.exists(src):
            sources.append(src)
            destinations.append(dst)
        elif not FileSystems.exists(dst):
            raise ConversionError(
                f"{src} vanished before it was moved to {dst}; no dataset was written. Rerun the conversion"
            )
    for folder in {rel.rsplit("/", 1)[0] for _, rel in moves if "/" in rel}:
        _mkdirs(_join(cfg.output, folder))
    if sources:
        FileSystems.rename(sources, destinations)


def _mkdirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except IOError:  # already there; object stores need none
        pass
