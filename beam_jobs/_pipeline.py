"""The conversion pipeline as small named Beam transforms.

    files (index, path)
      -> [InferTypes]      per-column type counts -> one dict (side input), CSV only
      -> ConvertFiles      per chunk: type, quarantine, encode, frame, assign split and
                           shard, append to per-bundle fragment files
                           outputs: fragments, quarantine files, stats
      -> GroupFragments    (split, shard) -> [fragment]      small descriptors only
      -> CommitShards      one TFRecord per (split, shard), shuffled within the shard
      -> Finalize          checks, moves shards into place, writes the metadata last

Records never pass through a GroupByKey: on the DirectRunner that would hold the whole
corpus in memory. Fragments on disk bound memory by the shard size instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid

import apache_beam as beam
import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs import _commit, _csv_ranges, _fragments, _images, _plan, _sources, _typing
from beam_jobs._background import BackgroundWriter, prefetched
from beam_jobs._config import JobConfig, decided_types
from beam_jobs._example_encoder import encode_batch
from beam_jobs._finalize import finalize_dataset
from beam_jobs._tfrecord import frames_array, grouped_frames

logger = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 10.0


# --- stats: plain dicts so any runner can merge them -------------------------------


def _empty_stats() -> dict:
    return {"rows": 0, "bad": 0, "split_records": {}, "missing": {}, "min_len": {}, "max_len": {}, "reasons": {}, "counters": {}}


def merge_stats(many) -> dict:
    out = _empty_stats()
    for s in many:
        out["rows"] += s["rows"]
        out["bad"] += s["bad"]
        for key in ("split_records", "missing", "reasons", "counters"):
            for k, v in s[key].items():
                out[key][k] = out[key].get(k, 0) + v
        for k, v in s["min_len"].items():
            out["min_len"][k] = min(v, out["min_len"].get(k, v))
        for k, v in s["max_len"].items():
            out["max_len"][k] = max(v, out["max_len"].get(k, v))
    return out


# --- type inference ----------------------------------------------------------------


class _CountTypes(beam.DoFn):
    def __init__(self, cfg: JobConfig):
        self._cfg = cfg

    def process(self, item):
        _, path, byte_range = item
        cfg = self._cfg
        for chunk in prefetched(_sources.iter_csv_chunks(path, list(cfg.header), cfg.csv, list(cfg.columns), byte_range)):
            counts = _typing.count_types(chunk.batch)
            yield {k: dataclasses.asdict(v) for k, v in counts.items()}


def _merge_type_counts(many) -> dict:
    total = _typing.merge_counts({k: _typing.TypeCounts(**v) for k, v in c.items()} for c in many)
    return {k: dataclasses.asdict(v) for k, v in total.items()}


# --- conversion --------------------------------------------------------------------


def _in_global_window(value):
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


class _ConvertFiles(beam.DoFn):
    """Reads whole files and scatters encoded records into fragment files per shard."""

    FRAGMENTS, QUARANTINE, STATS = "fragments", "quarantine", "stats"

    def __init__(self, cfg: JobConfig):
        self._cfg = cfg
        self._rows_read = Metrics.counter("ingest", "rows_read")
        self._rows_bad = Metrics.counter("ingest", "rows_quarantined")
        self._records = Metrics.counter("ingest", "records_written")

    def start_bundle(self):
        self._bundle = uuid.uuid4().hex[:12]
        self._fragments = _fragments.FragmentWriter(self._cfg.tmp_dir, self._bundle)
        self._stats = _empty_stats()
        self._quarantine = None
        self._quarantine_count = 0
        self._last_log = time.monotonic()
        self._start = time.monotonic()

    def process(self, item, type_counts=None):
        cfg = self._cfg
        file_index, path, byte_range = item
        part = byte_range.index if byte_range is not None else 0
        types = decided_types(cfg, type_counts)
        position = {s: 0 for s in range(len(cfg.splits))}  # records per split so far in this file
        if cfg.source_format == "csv":
            chunks = _sources.iter_csv_chunks(path, list(cfg.header), cfg.csv, list(cfg.columns), byte_range)
        elif cfg.source_format == "images":
            chunks = _images.iter_image_chunks(path, cfg.images, cfg.vocabulary, cfg.extra_types)
            path = cfg.input_pattern  # an image item is a list of entries; bad ones name their file
        else:
            chunks = _sources.iter_parquet_chunks(path, list(cfg.columns))
        # The next chunk is read and parsed while this one is typed and encoded.
        for chunk_index, chunk in enumerate(prefetched(chunks)):
            self._convert_chunk(path, (file_index, part, chunk_index), chunk, types, position)
            self._maybe_log_progress()
        if not cfg.shuffle:
            # One fragment per file keeps source order when fragments are concatenated.
            yield from (beam.pvalue.TaggedOutput(self.FRAGMENTS, f) for f in self._fragments.close())

    def _convert_chunk(self, path, where, chunk, types, position):
        """`where`: (file index, byte range index, chunk index), the chunk's place in the input."""
        cfg = self._cfg
        file_index, part, chunk_index = where
        batch, rows = chunk.batch, chunk.rows
        bad = list(chunk.bad)
        n = batch.num_rows
        bad_mask = np.zeros(n, bool)
        cols = []
        for name in cfg.columns:
            dtype, shape = types[name]
            raw = batch.column(name)
            if cfg.source_format == "csv":
                arr, bad_cells = _typing.convert_text_column(raw, dtype)
                for i in np.flatnonzero(bad_cells & ~bad_mask):
                    value = raw[i].as_py().decode("utf-8", "backslashreplace")
                    bad.append(_sources.BadRow(path, int(rows[i]), f"column {name!r}: {_typing.bad_cell_reason(value, dtype)}", _sources.row_text(batch, i, cfg.csv), "type"))
                bad_mask |= bad_cells
            else:
                unfit = []  # (row in chunk, reason): values the stored type cannot hold
                try:
                    got_dtype, got_shape, arr = _typing.canonical_arrow_column(raw, name, unfit=unfit)
                except _typing.UnstorableValue as e:
                    row = "" if e.index is None else f", row {int(rows[e.index])}"
                    raise ValueError(f"input file {path}{row}: {e}") from e
                for i, reason in unfit:
                    if not bad_mask[i]:
                        bad.append(_sources.BadRow(path, int(rows[i]), reason, _row_repr(cfg, batch, i), "type"))
                    bad_mask[i] = True
                if (got_dtype, got_shape) != (dtype, shape):
                    raise ValueError(
                        f"input file {path}: column {name!r} has type {raw.type} ({got_dtype}, shape {got_shape}), "
                        f"but the first file has ({dtype}, shape {shape}); all files must share the schema"
                    )
            cols.append((name, dtype, arr))
        if cfg.label is not None:
            label_arr = cols[cfg.columns.index(cfg.label)][2]
            missing_label = ~np.asarray(label_arr.is_valid().to_numpy(zero_copy_only=False), bool)
            for i in np.flatnonzero(missing_label & ~bad_mask):
                bad.append(_sources.BadRow(path, int(rows[i]), f"label column {cfg.label!r} is missing", _row_repr(cfg, batch, i), "missing_label"))
            bad_mask |= missing_label
        if bad_mask.any():
            keep = pa.array(~bad_mask)
            cols = [(name, dtype, arr.filter(keep)) for name, dtype, arr in cols]
            rows = rows[~bad_mask]
        self._quarantine_rows(bad)
        for k, v in chunk.counters.items():
            self._stats["counters"][k] = self._stats["counters"].get(k, 0) + v
        good = len(rows)
        self._stats["rows"] += good + len(bad)
        self._rows_read.inc(good + len(bad))
        if not good:
            return
        self._update_feature_stats(cols, good)
        buf, frame_offsets, crcs = encode_batch(cols, good, framed=True)
        frames = frames_array(buf, frame_offsets)
        if cfg.split_key is None:
            hashes = crcs
        else:
            keys = cols[cfg.columns.index(cfg.split_key)][2]
            hashes = _key_hashes(keys)
        split_of = _plan.assign_splits(hashes, dict(cfg.splits))
        for s in np.unique(split_of):
            s = int(s)
            ids = np.flatnonzero(split_of == s)
            shard_of = _plan.assign_shards(
                len(ids), cfg.num_shards[s], shuffle=cfg.shuffle, seed=cfg.seed,
                file_index=file_index, chunk_index=chunk_index, first_record=position[s], part_index=part,
            )
            position[s] += len(ids)
            if cfg.shuffle:
                # Each shard's records leave the chunk in random order, so the commit only
                # has to interleave these runs at random to shuffle the shard uniformly.
                within = np.random.default_rng([cfg.seed, file_index, part, chunk_index, s]).permutation(len(ids))
                order = within[np.argsort(shard_of[within], kind="stable")]
            else:
                order = np.argsort(shard_of, kind="stable")
            # One C++ gather puts each shard's frames back to back.
            picked = frames if len(ids) == good and np.all(order[1:] > order[:-1]) else frames.take(ids[order])
            for shard, data, lengths in grouped_frames(picked, np.bincount(shard_of, minlength=cfg.num_shards[s])):
                self._fragments.append(s, shard, where, data, lengths)
            name = cfg.splits[s][0]
            self._stats["split_records"][name] = self._stats["split_records"].get(name, 0) + len(ids)
        self._records.inc(good)

    def _update_feature_stats(self, cols, n):
        st = self._stats
        for name, _, arr in cols:
            valid = arr.is_valid()
            present = pc.sum(valid).as_py() or 0
            st["missing"][name] = st["missing"].get(name, 0) + (n - present)
            if pa.types.is_large_list(arr.type) or pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
                lengths = pc.list_value_length(arr).drop_null()
                if len(lengths):
                    lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
                    st["min_len"][name] = min(lo, st["min_len"].get(name, lo))
                    st["max_len"][name] = max(hi, st["max_len"].get(name, hi))

    def _quarantine_rows(self, bad):
        if not bad:
            return
        if self._quarantine is None:
            self._quarantine_path = f"{self._cfg.tmp_dir}/quarantine/part-{self._bundle}.jsonl"
            self._quarantine = FileSystems.create(self._quarantine_path, mime_type="application/jsonl", compression_type=CompressionTypes.UNCOMPRESSED)
        lines = "".join(json.dumps(b.to_json(), ensure_ascii=False) + "\n" for b in bad)
        self._quarantine.write(lines.encode("utf-8"))
        self._quarantine_count += len(bad)
        self._stats["bad"] += len(bad)
        for b in bad:
            self._stats["reasons"][b.kind] = self._stats["reasons"].get(b.kind, 0) + 1
        self._rows_bad.inc(len(bad))

    def _maybe_log_progress(self):
        now = time.monotonic()
        if now - self._last_log >= _PROGRESS_EVERY_S:
            self._last_log = now
            rows = self._stats["rows"]
            logger.info("converted %d rows in this worker (%.0f rows/s), %d quarantined", rows, rows / (now - self._start), self._stats["bad"])

    def finish_bundle(self):
        for f in self._fragments.close():
            yield beam.pvalue.TaggedOutput(self.FRAGMENTS, _in_global_window(f))
        if self._quarantine is not None:
            self._quarantine.close()
            yield beam.pvalue.TaggedOutput(self.QUARANTINE, _in_global_window({"path": self._quarantine_path, "records": self._quarantine_count}))
        yield beam.pvalue.TaggedOutput(self.STATS, _in_global_window(self._stats))


def _row_repr(cfg, batch, i):
    if cfg.source_format == "csv":
        return _sources.row_text(batch, i, cfg.csv)
    return json.dumps({k: (v if not isinstance(v, bytes) else v.decode("utf-8", "backslashreplace")) for k, v in batch.slice(i, 1).to_pylist()[0].items()}, default=str)


def _key_hashes(keys: pa.Array) -> np.ndarray:
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        keys = pc.cast(keys, pa.string())
    value = google_crc32c.value
    return np.fromiter((value(k or b"") if isinstance(k, bytes) else value((k or "").encode()) for k in keys.to_pylist()), np.uint32, len(keys))


# --- commit ------------------------------------------------------------------------


class _CommitShard(beam.DoFn):
    """(split, shard) -> [Fragment] -> one shard file in the temp dir, shuffled if asked."""

    def __init__(self, cfg: JobConfig, budget: _commit.Budget = _commit.Budget()):
        self._cfg, self._budget = cfg, budget

    def process(self, element):
        (split, shard), fragments = element
        cfg = self._cfg
        ext = ".tfrecord.gz" if cfg.compression == "gzip" else ".tfrecord"
        path = f"{cfg.tmp_dir}/shards/{split:03d}-{shard:05d}{ext}"
        compression = CompressionTypes.GZIP if cfg.compression == "gzip" else CompressionTypes.UNCOMPRESSED
        rng = np.random.default_rng([cfg.seed, split, shard]) if cfg.shuffle else None
        with BackgroundWriter(FileSystems.create(path, compression_type=compression)) as out:
            records = _commit.write_shard(list(fragments), out, rng=rng, budget=self._budget)
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        yield {"split": split, "shard": shard, "path": path, "records": records, "bytes": size}


class _SplitCsv(beam.PTransform):
    """(file index, path) -> (file index, path, CsvRange | None): large CSV files become
    byte ranges, unless a scan finds newlines inside quoted fields (`_csv_ranges`)."""

    def __init__(self, cfg: JobConfig):
        super().__init__()
        self._cfg = cfg

    def expand(self, files):
        cfg = self._cfg
        planned = files | "PlanRanges" >> beam.FlatMap(_plan_ranges, cfg.file_sizes, cfg.csv_split_bytes).with_outputs("scan", main="whole")
        decided = (
            planned.scan
            # (file index, path, start, end)
            | "ScanRanges" >> beam.Map(lambda r: ((r[0], r[1]), (r[2], r[3], _csv_ranges.scan_range(*r[1:]))))
            | "ByFile" >> beam.GroupByKey()
            | "DecideRanges" >> beam.FlatMap(_decided_ranges, cfg.csv.allow_quoted_newlines)
        )
        return (planned.whole, decided) | "AllParts" >> beam.Flatten() | "SpreadParts" >> beam.Reshuffle()


def _plan_ranges(item, sizes, split_bytes):
    index, path = item
    ranges = _csv_ranges.plan_ranges(sizes[index], split_bytes) if _csv_ranges.splittable(path) else [(0, sizes[index])]
    if len(ranges) == 1:
        yield (index, path, None)
        return
    for start, end in ranges:
        yield beam.pvalue.TaggedOutput("scan", (index, path, start, end))


def _decided_ranges(element, quoted_newlines):
    (index, path), scans = element
    ranges = _csv_ranges.decide_ranges(path, list(scans), quoted_newlines=quoted_newlines)
    Metrics.counter("ingest", "csv_files_read_as_ranges" if ranges else "csv_files_read_whole").inc()
    for r in ranges or [None]:
        yield (index, path, r)


class ConvertToTFRecords(beam.PTransform):
    """files (index, path) -> one finalized dataset; yields the metadata JSON text."""

    def __init__(self, cfg: JobConfig):
        super().__init__()
        self._cfg = cfg.for_workers()

    def expand(self, files):
        cfg = self._cfg
        if cfg.csv_split_bytes and any(size > cfg.csv_split_bytes for size in cfg.file_sizes):
            files = files | "SplitCsv" >> _SplitCsv(cfg)
        else:
            files = files | "WholeFiles" >> beam.Map(lambda item: (*item, None))
        # (file index, path, CsvRange or None for the whole file)
        side = []
        type_counts = None
        if cfg.infer:
            type_counts = (
                files
                | "CountTypes" >> beam.ParDo(_CountTypes(cfg))
                | "MergeTypeCounts" >> beam.CombineGlobally(_merge_type_counts)
            )
            side = [beam.pvalue.AsSingleton(type_counts)]
        converted = files | "ConvertFiles" >> beam.ParDo(_ConvertFiles(cfg), *side).with_outputs(
            _ConvertFiles.FRAGMENTS, _ConvertFiles.QUARANTINE, _ConvertFiles.STATS
        )
        shards = (
            converted[_ConvertFiles.FRAGMENTS]
            # (split, shard) -> fragment descriptor
            | "KeyByShard" >> beam.Map(lambda f: (f.key, f))
            | "GroupFragments" >> beam.GroupByKey()
            | "CommitShards" >> beam.ParDo(_CommitShard(cfg))
        )
        stats = converted[_ConvertFiles.STATS] | "MergeStats" >> beam.CombineGlobally(merge_stats)
        finalize_side = [
            beam.pvalue.AsList(shards),
            beam.pvalue.AsSingleton(stats),
            beam.pvalue.AsList(converted[_ConvertFiles.QUARANTINE]),
        ]
        if type_counts is not None:
            finalize_side.append(beam.pvalue.AsSingleton(type_counts))
        return (
            files.pipeline
            | "FinalizeTrigger" >> beam.Create([None])
            | "Finalize" >> beam.Map(finalize_dataset, cfg, *finalize_side)
        )
