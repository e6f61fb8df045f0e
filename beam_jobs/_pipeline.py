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
import os
import tempfile
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

from beam_jobs import _csv_ranges, _images, _plan, _sources, _typing
from beam_jobs._background import BackgroundWriter, prefetched
from beam_jobs._config import JobConfig, decided_types
from beam_jobs._example_encoder import encode_batch
from beam_jobs._finalize import finalize_dataset
from beam_jobs._tfrecord import TFRecordError, frames_array, frames_data, offsets_of

logger = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 10.0
_INDEX_SUFFIX = ".index"  # little-endian int64 frame lengths beside each fragment


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
        self._writers = {}
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
            yield from (beam.pvalue.TaggedOutput(self.FRAGMENTS, f) for f in self._close_writers())

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
            for shard, data, lengths in _groups(picked, np.bincount(shard_of, minlength=cfg.num_shards[s])):
                self._write_fragment(s, shard, where, data, lengths)
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

    def _write_fragment(self, split, shard, where, data, lengths):
        """Appends frames to this bundle's fragment of (split, shard), and their lengths to
        its index, so the commit can cut and shuffle frames without parsing them."""
        key = (split, shard)
        w = self._writers.get(key)
        if w is None:
            path = f"{self._cfg.tmp_dir}/fragments/{split:03d}-{shard:05d}/{'-'.join(f'{i:06d}' for i in where)}-{self._bundle}.tfrecord"
            w = self._writers[key] = {
                "file": BackgroundWriter(FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)),
                "index_file": FileSystems.create(path + _INDEX_SUFFIX, compression_type=CompressionTypes.UNCOMPRESSED),
                "path": path, "records": 0, "bytes": 0, "order": where, "segments": [],
            }
        w["file"].write(data)
        w["index_file"].write(np.asarray(lengths, "<i8").tobytes())
        w["records"] += len(lengths)
        w["bytes"] += len(data)
        w["segments"].append(len(lengths))  # one run of frames per chunk, shuffled within

    def _close_writers(self):
        out = []
        for (split, shard), w in self._writers.items():
            w["file"].close()
            w["index_file"].close()
            out.append({"split": split, "shard": shard, "path": w["path"], "records": w["records"], "bytes": w["bytes"],
                        "order": list(w["order"]), "segments": w["segments"]})
        self._writers = {}
        return out

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
        for f in self._close_writers():
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
    """Concatenates one shard's fragments into a shard file, shuffled if asked.

    Memory stays bounded whatever the shard and corpus size. Each chunk wrote its share
    of the shard as a run in random order, so a shard of up to MAX_MERGED_RUNS runs is
    shuffled by interleaving the runs at random (`_merged`: sequential reads, one pass).
    With more runs, a shard of up to IN_MEMORY_BYTES is loaded and permuted whole; a
    larger one is shuffled externally: frames are streamed into local temp files (a
    random bucket each), then each bucket is loaded, permuted and appended. A random
    bucket per record plus a random order within each bucket is a uniformly random
    order of the shard. Frames are cut by the fragments' length index and reordered by
    Arrow's `take`, in C++. The budgets are small next to the job's ~250 MB base, so
    peak RSS stays flat from small corpora to large ones.
    """

    # Up to this many runs (chunks) in a shard, it is shuffled by interleaving them; each
    # output slice then reads from up to this many places, fine locally and on GCS.
    MAX_MERGED_RUNS = 64
    IN_MEMORY_BYTES = 64 << 20
    BUCKET_BYTES = 32 << 20
    _READ_BYTES = 8 << 20  # frames read from a fragment at a time
    _WRITE_BYTES = 16 << 20  # permuted frames gathered per write

    def __init__(self, cfg: JobConfig):
        self._cfg = cfg

    def process(self, element):
        (split, shard), fragments = element
        cfg = self._cfg
        fragments = sorted(fragments, key=lambda f: (tuple(f["order"]), f["path"]))
        ext = ".tfrecord.gz" if cfg.compression == "gzip" else ".tfrecord"
        path = f"{cfg.tmp_dir}/shards/{split:03d}-{shard:05d}{ext}"
        compression = CompressionTypes.GZIP if cfg.compression == "gzip" else CompressionTypes.UNCOMPRESSED
        with BackgroundWriter(FileSystems.create(path, compression_type=compression)) as out:
            if cfg.shuffle:
                records = self._shuffled(fragments, out, np.random.default_rng([cfg.seed, split, shard]))
            else:
                records = 0
                for f in fragments:
                    with FileSystems.open(f["path"], compression_type=CompressionTypes.UNCOMPRESSED) as src:
                        while block := src.read(8 << 20):
                            out.write(block)
                    records += f["records"]
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        yield {"split": split, "shard": shard, "path": path, "records": records, "bytes": size}

    def _pieces(self, fragments):
        """Yields the shard's frames as Arrow arrays of at most ~_READ_BYTES each."""
        for f in fragments:
            lengths = self._index(f)
            ends = np.cumsum(lengths)
            with FileSystems.open(f["path"], compression_type=CompressionTypes.UNCOMPRESSED) as src:
                first = 0
                while first < len(lengths):
                    start = int(ends[first - 1]) if first else 0
                    last = max(first + 1, int(np.searchsorted(ends, start + self._READ_BYTES, side="right")))
                    data = np.empty(int(ends[last - 1]) - start, np.uint8)
                    _read_into(src, memoryview(data), f["path"])
                    yield frames_array(data, offsets_of(lengths[first:last]))
                    first = last

    def _merged(self, fragments, out, rng, total_bytes: int) -> int:
        """Interleaves the shard's runs (each already in random order) at random.

        A uniformly random sequence of run labels, each run's label as often as it has
        records, says which run gives the next record: with every run in uniform random
        order, that is a uniform shuffle of the shard. Each output slice reads the next
        few frames of every run it draws from, so reading stays sequential per run and
        memory stays at a slice.
        """
        runs = []  # (fragment position, first byte, frame lengths)
        for i, f in enumerate(fragments):
            lengths, first, byte = self._index(f), 0, 0
            for count in f["segments"]:
                runs.append((i, byte, lengths[first : first + count]))
                byte += int(lengths[first : first + count].sum())
                first += count
        sizes = np.array([len(r[2]) for r in runs], np.int64)
        labels = rng.permutation(np.repeat(np.arange(len(runs), dtype=np.int32), sizes))
        bounds = [offsets_of(r[2]) for r in runs]
        taken = np.zeros(len(runs), np.int64)
        step = max(1, len(labels) * self._WRITE_BYTES // max(total_bytes, 1))
        files = [FileSystems.open(f["path"], compression_type=CompressionTypes.UNCOMPRESSED) for f in fragments]
        try:
            for start in range(0, len(labels), step):
                drawn = labels[start : start + step]
                counts = np.bincount(drawn, minlength=len(runs))
                picked = np.flatnonzero(counts)
                spans = [(int(bounds[r][taken[r]]), int(bounds[r][taken[r] + counts[r]])) for r in picked]
                buf = np.empty(sum(b - a for a, b in spans), np.uint8)
                at = 0
                for r, (a, b) in zip(picked, spans):  # frames of each run, in run order
                    src = files[runs[r][0]]
                    src.seek(runs[r][1] + a)
                    _read_into(src, memoryview(buf)[at : at + b - a], fragments[runs[r][0]]["path"])
                    at += b - a
                lengths = np.concatenate([runs[r][2][taken[r] : taken[r] + counts[r]] for r in picked])
                taken[picked] += counts[picked]
                # The k-th draw of run r is that run's k-th frame in this slice: a stable
                # sort of the labels lists the slice's frames in buffer order.
                where = np.empty(len(drawn), np.int64)
                where[np.argsort(drawn, kind="stable")] = np.arange(len(drawn))
                out.write(frames_data(frames_array(buf, offsets_of(lengths)).take(where))[0])
        finally:
            for f in files:
                f.close()
        return len(labels)

    def _loaded(self, fragments) -> pa.Array:
        """Every frame of the shard, read straight into one buffer."""
        buf = np.empty(sum(f["bytes"] for f in fragments), np.uint8)
        lengths, at = [], 0
        for f in fragments:
            lengths.append(self._index(f))
            with FileSystems.open(f["path"], compression_type=CompressionTypes.UNCOMPRESSED) as src:
                _read_into(src, memoryview(buf)[at : at + f["bytes"]], f["path"])
            at += f["bytes"]
        lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        return frames_array(buf, offsets_of(lengths))

    @staticmethod
    def _index(f) -> np.ndarray:
        with FileSystems.open(f["path"] + _INDEX_SUFFIX, compression_type=CompressionTypes.UNCOMPRESSED) as idx:
            lengths = np.frombuffer(idx.read(), "<i8")
        if len(lengths) != f["records"] or int(lengths.sum()) != f["bytes"]:
            raise TFRecordError(f"fragment {f['path']}: index holds {len(lengths)} frames, expected {f['records']}")
        return lengths

    def _shuffled(self, fragments, out, rng) -> int:
        total_bytes = sum(f.get("bytes", 0) for f in fragments)
        if sum(len(f["segments"]) for f in fragments) <= self.MAX_MERGED_RUNS:
            return self._merged(fragments, out, rng, total_bytes)
        if total_bytes <= self.IN_MEMORY_BYTES:
            frames = self._loaded(fragments)
            self._write_permuted(frames, out, rng)
            return len(frames)
        buckets = max(1, -(-total_bytes // self.BUCKET_BYTES))
        records = 0
        with tempfile.TemporaryDirectory(prefix="ingest-commit-") as tmp:
            files = [open(os.path.join(tmp, f"b{i}"), "w+b") for i in range(buckets)]
            sizes = [[] for _ in range(buckets)]
            try:
                for piece in self._pieces(fragments):
                    bucket_of = rng.integers(0, buckets, size=len(piece))
                    grouped = piece.take(np.argsort(bucket_of, kind="stable"))
                    for b, data, lengths in _groups(grouped, np.bincount(bucket_of, minlength=buckets)):
                        files[b].write(data)
                        sizes[b].append(lengths)
                for b, f in enumerate(files):
                    f.seek(0)
                    lengths = np.concatenate(sizes[b]) if sizes[b] else np.zeros(0, np.int64)
                    self._write_permuted(frames_array(f.read(), offsets_of(lengths)), out, rng)
                    records += len(lengths)
            finally:
                for f in files:
                    f.close()
        return records

    def _write_permuted(self, frames, out, rng):
        n = len(frames)
        if not n:
            return
        perm = rng.permutation(n)
        step = max(1, n * self._WRITE_BYTES // max(frames_data(frames)[0].nbytes, 1))
        for start in range(0, n, step):
            out.write(frames_data(frames.take(perm[start : start + step]))[0])


def _groups(frames: pa.Array, counts: np.ndarray):
    """Yields (key, bytes, frame lengths) for each key with frames, given frames grouped
    by key in key order and `counts[key]` frames per key."""
    data, lengths = frames_data(frames)
    ends = offsets_of(lengths)
    first = 0
    for key in np.flatnonzero(counts):
        last = first + int(counts[key])
        yield int(key), data[int(ends[first]) : int(ends[last])], lengths[first:last]
        first = last


def _read_into(src, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view) and (n := src.readinto(view[got:])):
        got += n
    if got != len(view):
        raise TFRecordError(f"fragment {path} is truncated: wanted {len(view)} more bytes, got {got}")


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
            | "KeyByShard" >> beam.Map(lambda f: ((f["split"], f["shard"]), f))
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
