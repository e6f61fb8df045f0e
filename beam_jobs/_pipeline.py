"""The conversion pipeline as small named Beam transforms; what differs by input format
is the job's source adapter (`beam_jobs.sources`), what happens to one chunk is `_chunk`.

    work items            (index, path, None), or (index, (ImageEntry, ...), None)
      -> [SplitCsv]       (index, path, CsvRange | None): large CSV files as byte ranges
      -> [CountTypes]     {column: TypeCounts} per chunk -> one dict (side input), CSV only
      -> ConvertFiles     per chunk: type, quarantine, encode, route to split and shard,
                          append to per-bundle fragment files (blocks layout: the
                          rows' columns, as Arrow IPC)
                          outputs: Fragment, {"path", "records"} of quarantine files,
                          ConversionStats (with the statistics, rows layout)
      -> GroupFragments   ((split, shard), [Fragment])      small descriptors only
      -> CommitShards     {"split", "shard", "path", "records", "bytes", "blocks", "index", "fingerprint"}:
                          one TFRecord per (split, shard), shuffled within the shard
                          (`commit_rows`; blocks layout: rows shuffled, then cut into blocks,
                          `output.commit_blocks`, the shard's block index written beside it,
                          and the shard's statistics gathered from them)
      -> Finalize         checks, moves shards into place, writes the metadata last

Records never pass through a GroupByKey: on the DirectRunner that would hold the whole
corpus in memory. Fragments on disk bound memory by the shard size instead.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs import _chunk
from beam_jobs._background import BackgroundWriter, OneAhead, prefetched
from beam_jobs._config import JobConfig
from beam_jobs._errors import full_disk_named
from beam_jobs._finalize import finalize_dataset
from beam_jobs.encode.examples import encode_batch
from beam_jobs.encode.tfrecord import frames_array
from beam_jobs.output import commit_rows
from beam_jobs.output import directory as output_dir
from beam_jobs.output import fragments as fragment_files
from beam_jobs.output.commit_blocks import run_bytes, write_block_index, write_block_shard
from beam_jobs.sources.parsed_chunks import KEPT
from beam_jobs.stats import features as feature_stats
from beam_jobs.stats import vocabulary
from beam_jobs.stats.conversion import ConversionStats
from ingest import contract

logger = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 10.0


# --- type inference ----------------------------------------------------------------


def _item_key(item) -> tuple:
    """A work item's (index, byte range index): what the two passes over it share."""
    return item[0], item[2].index if item[2] is not None else None


class _CountTypes(beam.DoFn):
    """(index, path, range) -> per-column type counts of each chunk (CSV inference).

    The chunks it parses stay in this process for ConvertFiles, within a budget
    (`sources/parsed_chunks`): read once, not twice, when both stages run here.
    """

    def __init__(self, cfg: JobConfig):
        self._source = cfg.source
        self._job = cfg.job_id

    def process(self, item):
        keeper = KEPT.keeper(self._job, _item_key(item))
        yield from self._source.count_types(item, keep=keeper.add)
        keeper.publish()


# --- conversion --------------------------------------------------------------------


def _in_global_window(value):
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


class _ConvertFiles(beam.DoFn):
    """Reads work items and scatters encoded records into fragment files per shard."""

    FRAGMENTS, QUARANTINE, STATS, VOCABULARY = "fragments", "quarantine", "stats", "vocabulary"

    def __init__(self, cfg: JobConfig):
        self._cfg = cfg
        self._rows_read = Metrics.counter("ingest", "rows_read")
        self._rows_bad = Metrics.counter("ingest", "rows_quarantined")
        self._records = Metrics.counter("ingest", "records_written")
        self._kept = Metrics.counter("ingest", "csv_items_parsed_once")
        self._reparsed = Metrics.counter("ingest", "csv_items_parsed_again")

    def start_bundle(self):
        self._bundle = uuid.uuid4().hex[:12]
        self._fragments = fragment_files.FragmentWriter(self._cfg.tmp_dir, self._bundle)
        self._stats = ConversionStats()
        self._statistics = OneAhead("ingest-statistics")
        self._counts = vocabulary.Counts(contract.VOCABULARY_LIMIT)
        self._quarantine = None
        self._quarantine_count = 0
        self._last_log = time.monotonic()
        self._start = time.monotonic()

    def process(self, item, type_counts=None):
        try:
            with full_disk_named(self._cfg.tmp_dir):
                yield from self._process(item, type_counts)
        except BaseException:
            self._abort()
            raise

    def _process(self, item, type_counts):
        cfg = self._cfg
        file_index, _, byte_range = item
        part = byte_range.index if byte_range is not None else 0
        decided = cfg.decide(type_counts)
        self._kinds = _kinds(decided)
        self._vocabulary_names = _vocabulary_features(cfg, decided)
        routing = _chunk.Routing(cfg.splits, decided.num_shards, cfg.shuffle, cfg.seed)
        position: dict = {}  # split -> records of this file part so far
        kept = KEPT.take(cfg.job_id, _item_key(item)) if cfg.source.infer else None
        if cfg.source.infer:
            # Parsed once when this process kept what type inference parsed; else again
            # (another worker inferred it, or the kept chunks' budget was spent).
            self._reparsed.inc(kept is None)
            self._kept.inc(kept is not None)
        if kept is None:
            path, chunks = cfg.source.read(item)
            # The next chunk is read and parsed while this one is typed and encoded.
            chunks = prefetched(chunks)
        else:
            path, chunks = cfg.source.read(item, kept=kept)
        for chunk_index, chunk in enumerate(chunks):
            self._convert_chunk(path, (file_index, part, chunk_index), chunk, decided.types, routing, position)
            self._maybe_log_progress()
        if not cfg.shuffle:
            # One fragment per file keeps source order when fragments are concatenated.
            yield from (beam.pvalue.TaggedOutput(self.FRAGMENTS, f) for f in self._fragments.close())

    def _convert_chunk(self, path, where, chunk, types, routing, position):
        """`where`: (file index, byte range index, chunk index), the chunk's place in the input."""
        cfg = self._cfg
        done = _chunk.typed(cfg.source, path, chunk, types, cfg.label)
        self._quarantine_rows(done.bad)
        self._stats.add_counters(chunk.counters)
        self._stats.add_bent(chunk.bent)
        good = len(done.rows)
        self._stats.rows += good + len(done.bad)
        self._rows_read.inc(good + len(done.bad))
        if not good:
            return
        self._stats.add_features(done.cols, good)
        # A feature past the vocabulary limit in this bundle is past it in the job: no more counting.
        counted = [n for n in self._vocabulary_names if not self._counts.dropped(n)]
        if counted:
            self._counts.add(vocabulary.count_chunk(done.cols, counted))
        file_index, part, chunk_index = where
        # The split comes from a hash of the row record's bytes (the same split in both
        # layouts) or of the --split_key value. Blocks encode row records only for that
        # hash: not at all with one split or a key.
        buf = frame_offsets = None
        encoded = cfg.layout == "rows" or (cfg.split_key is None and len(cfg.splits) > 1)
        if encoded:
            buf, frame_offsets, crcs = encode_batch(done.cols, good, framed=True)
        if cfg.split_key is not None:
            hashes = _chunk.key_hashes(next(arr for name, _, arr in done.cols if name == cfg.split_key))
        else:
            hashes = crcs if encoded else np.zeros(good, np.uint32)
        split_of = _chunk.splits_of(hashes, routing)
        added: dict = {}
        if cfg.layout == "blocks":
            # Columns, not blocks: the commit shuffles rows first, then cuts blocks (output.commit_blocks).
            for split, shard, rows in _chunk.route(split_of, routing, where, position):
                data = run_bytes(done.cols, np.sort(rows))
                self._fragments.append(split, shard, where, data, [len(data)], rows=len(rows))
                added[split] = added.get(split, 0) + len(rows)
        else:
            for split, shard, data, lengths in _chunk.routed(
                frames_array(buf, frame_offsets), split_of, routing, where, position
            ):
                self._fragments.append(split, shard, where, data, lengths)
                added[split] = added.get(split, 0) + len(lengths)
        for split, n in added.items():
            position[split] = position.get(split, 0) + n
            self._stats.add_records(cfg.splits[split][0], n)
        self._records.inc(good)
        if cfg.statistics and not _statistics_in_commit(cfg):
            keys = feature_stats.chunk_keys(good, [cfg.seed, file_index, part, chunk_index])
            # In a helper, while this thread goes on to the next chunk: numpy and Arrow do
            # the work without the GIL, on a core the reader leaves mostly idle. One chunk
            # at a time, so the statistics hold at most one chunk.
            self._statistics.submit(self._stats.add_statistics, done.cols, self._kinds, split_of, cfg.split_names, keys)

    def _quarantine_rows(self, bad):
        if not bad:
            return
        if self._quarantine is None:
            self._quarantine_path = f"{self._cfg.tmp_dir}/quarantine/part-{self._bundle}.jsonl"
            self._quarantine = FileSystems.create(
                self._quarantine_path, mime_type="application/jsonl", compression_type=CompressionTypes.UNCOMPRESSED
            )
        lines = "".join(json.dumps(b.to_json(), ensure_ascii=False) + "\n" for b in bad)
        self._quarantine.write(lines.encode("utf-8"))
        self._quarantine_count += len(bad)
        self._stats.add_bad(b.kind for b in bad)
        self._rows_bad.inc(len(bad))

    def _maybe_log_progress(self):
        now = time.monotonic()
        if now - self._last_log >= _PROGRESS_EVERY_S:
            self._last_log = now
            rows = self._stats.rows
            logger.info(
                "converted %d rows in this worker (%.0f rows/s), %d quarantined",
                rows,
                rows / (now - self._start),
                self._stats.bad,
            )

    def finish_bundle(self):
        try:
            with full_disk_named(self._cfg.tmp_dir):
                yield from self._finish_bundle()
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        """No file of a failed bundle left open: an open file holds its device busy."""
        self._fragments.abort()
        if self._quarantine is not None:
            try:
                self._quarantine.close()
            except Exception:  # the failure being raised is the one that matters
                pass

    def _finish_bundle(self):
        self._statistics.close()
        for f in self._fragments.close():
            yield beam.pvalue.TaggedOutput(self.FRAGMENTS, _in_global_window(f))
        if self._quarantine is not None:
            self._quarantine.close()
            yield beam.pvalue.TaggedOutput(
                self.QUARANTINE, _in_global_window({"path": self._quarantine_path, "records": self._quarantine_count})
            )
        yield beam.pvalue.TaggedOutput(self.STATS, _in_global_window(self._stats.pack()))
        if self._counts.names:
            yield beam.pvalue.TaggedOutput(self.VOCABULARY, _in_global_window(self._counts))


# --- commit ------------------------------------------------------------------------


def _statistics_in_commit(cfg: JobConfig) -> bool:
    """Whether the commit gathers the statistics (blocks layout, `Source.statistics_while_reading`)."""
    return cfg.statistics and cfg.layout == "blocks" and not cfg.source.statistics_while_reading


def _vocabulary_features(cfg: JobConfig, decided) -> frozenset:
    """The features that get a vocabulary: text ones, but the label (its classes are its ids)."""
    return frozenset(
        name
        for name, (dtype, _) in decided.types.items()
        if dtype == "bytes" and name not in decided.binary and name != cfg.label
    )


def _vocabularies(counts: vocabulary.Counts, cfg: JobConfig) -> dict:
    """{feature: {"values": its vocabulary (large_binary), "note": why values were left out}}.
    Their top values and distinct count are the statistics' own: counted exactly up to the
    same limit (`stats.features._Counts`)."""
    carried = cfg.source.schema.vocabularies if cfg.source.schema is not None else {}
    out = {}
    for name in sorted(set(counts.names) | set(carried)):
        values, note = vocabulary.ranked(counts.table(name), contract.VOCABULARY_LIMIT, carried.get(name, ()))
        if values or not note:
            arrow = pa.array([v.encode("utf-8", "surrogateescape") for v in values], pa.large_binary())
            out[name] = {"values": arrow, "note": note}
        else:
            out[name] = {"values": None, "note": note}
    return out


def _kinds(decided) -> dict:
    """Each column's kind of statistics (`feature_stats.kind_of`)."""
    return {
        name: feature_stats.kind_of(dtype, name not in decided.binary) for name, (dtype, _) in decided.types.items()
    }


class _CommitShard(beam.DoFn):
    """(split, shard) -> [Fragment] -> one shard file in the temp dir, shuffled if asked.

    Blocks layout: the shard's statistics too (packed ConversionStats, output STATS),
    gathered from its runs of rows as they are read, in a helper thread beside the
    shuffle and the encoding: the commit runs on one core and leaves the other free,
    where ConvertFiles shares both with the reader. Not for a source whose reading keeps
    ConvertFiles waiting (`Source.statistics_while_reading`: CSV), nor the rows layout
    (its fragments hold records): those gather them in ConvertFiles.
    """

    STATS = "stats"

    def __init__(self, cfg: JobConfig, budget: commit_rows.Budget = commit_rows.Budget()):
        self._cfg, self._budget = cfg, budget

    def process(self, element, vocabularies, type_counts=None):
        with full_disk_named(self._cfg.tmp_dir):
            yield from self._commit(element, vocabularies, type_counts)

    def _commit(self, element, vocabularies, type_counts):
        (split, shard), fragments = element
        cfg = self._cfg
        ext = ".tfrecord.gz" if cfg.compression == "gzip" else ".tfrecord"
        path = f"{cfg.tmp_dir}/shards/{split:03d}-{shard:05d}{ext}"
        compression = CompressionTypes.GZIP if cfg.compression == "gzip" else CompressionTypes.UNCOMPRESSED
        rng = np.random.default_rng([cfg.seed, split, shard]) if cfg.shuffle else None
        fragments = list(fragments)
        lengths = None  # blocks layout: each block's frame length
        with BackgroundWriter(FileSystems.create(path, compression_type=compression)) as out:
            if cfg.layout == "blocks":
                stats = ConversionStats() if _statistics_in_commit(cfg) else None
                with OneAhead("ingest-statistics") as helper:  # starts no thread unless given work
                    gather = self._statistics_of(stats, helper, split, shard, type_counts) if stats else None
                    lengths = write_block_shard(
                        fragments,
                        out,
                        rng=rng,
                        block_rows=cfg.block_rows,
                        budget=self._budget,
                        on_rows=gather,
                        defaults=cfg.defaults,
                        vocabularies=self._lookups(vocabularies),
                    )
                frames = len(lengths)
                if stats is not None:
                    yield beam.pvalue.TaggedOutput(self.STATS, stats.pack())
            else:
                frames = commit_rows.write_shard(fragments, out, rng=rng, budget=self._budget)
        # The blocks' offsets, so that a reader need not scan the shard's frame headers to
        # seek (a gzip shard has no block offsets: it is read as a stream).
        index = None
        if lengths is not None and cfg.compression == "none":
            index = contract.index_filename(path)
            write_block_index(index, lengths)
        size = FileSystems.match([output_dir.literal_pattern(path)])[0].metadata_list[0].size_in_bytes
        rows = sum(f.rows for f in fragments)
        blocks = frames if cfg.layout == "blocks" else None
        yield {
            "split": split,
            "shard": shard,
            "path": path,
            "records": rows,
            "blocks": blocks,
            "bytes": size,
            "index": index,
            # Checked when the runtime opens the shard: one swapped in is refused.
            "fingerprint": output_dir.fingerprint(path, size),
        }

    def _lookups(self, vocabularies: dict) -> dict:
        """{feature: {value: id}} of the side input's vocabularies, built once per worker."""
        if getattr(self, "_lookups_of", (None,))[0] is not vocabularies:
            built = {k: vocabulary.lookup_of(v["values"]) for k, v in vocabularies.items() if v["values"] is not None}
            self._lookups_of = (vocabularies, built)
        return self._lookups_of[1]

    def _statistics_of(self, stats: ConversionStats, helper: OneAhead, split: int, shard: int, type_counts):
        """A callback for each run of rows the commit reads: adds their statistics to
        `stats` in `helper`, one run at a time."""
        cfg = self._cfg
        kinds = _kinds(cfg.decide(type_counts))

        def gather(cols, n: int, index: int) -> None:
            keys = feature_stats.chunk_keys(n, [cfg.seed, split, shard, index])
            helper.submit(stats.add_statistics, cols, kinds, np.full(n, split), cfg.split_names, keys)

        return gather


def _finalize(
    trigger, cfg: JobConfig, shards: list, stats: bytes, quarantine: list, vocabularies: dict, *type_counts
) -> str:
    with full_disk_named(cfg.output):
        stats = ConversionStats.unpack(stats)
        return finalize_dataset(trigger, cfg, shards, stats, quarantine, *type_counts, vocabularies=vocabularies)


def _total_of(merged, merge) -> beam.pvalue.AsSingleton:
    """The side input of a global merge without defaults: its value, or the merge of nothing."""
    return beam.pvalue.AsSingleton(merged, default_value=merge([]))


class ConvertToTFRecords(beam.PTransform):
    """work items (index, path or entries, None) -> one finalized dataset; yields the metadata JSON text."""

    def __init__(self, cfg: JobConfig):
        super().__init__()
        self._cfg = cfg.for_workers()

    def expand(self, items):
        cfg = self._cfg
        files = cfg.source.expand_items(items)
        # (file index, path, CsvRange or None for the whole file), or (item index, image entries, None)
        side = []
        type_counts = None
        if cfg.source.infer:
            type_counts = (
                files
                | "CountTypes" >> beam.ParDo(_CountTypes(cfg))
                # the source's counts for one chunk (CSV: {column: TypeCounts})
                | "MergeTypeCounts" >> beam.CombineGlobally(cfg.source.merge_type_counts).without_defaults()
                # one total, a side input of ConvertFiles and Finalize
            )
            side = [_total_of(type_counts, cfg.source.merge_type_counts)]
        converted = files | "ConvertFiles" >> beam.ParDo(_ConvertFiles(cfg), *side).with_outputs(
            _ConvertFiles.FRAGMENTS, _ConvertFiles.QUARANTINE, _ConvertFiles.STATS, _ConvertFiles.VOCABULARY
        )
        # Fragment | {"path", "records"} of a quarantine file | a bundle's ConversionStats, packed |
        # a bundle's text value counts (vocabulary.Counts)
        vocabularies = beam.pvalue.AsSingleton(
            converted[_ConvertFiles.VOCABULARY]
            | "MergeValueCounts" >> beam.CombineGlobally(vocabulary.Counts.merge_all).without_defaults()
            | "RankVocabularies" >> beam.Map(_vocabularies, cfg),
            # {feature: {"values", "note"}}: the blocks' ids (CommitShards) and the vocabulary files (Finalize)
            default_value=_vocabularies(vocabulary.Counts(contract.VOCABULARY_LIMIT), cfg),
        )
        shards = (
            converted[_ConvertFiles.FRAGMENTS]
            # Fragment
            | "KeyByShard" >> beam.Map(lambda f: (f.key, f))
            # ((split, shard), Fragment)
            | "GroupFragments" >> beam.GroupByKey()
            # ((split, shard), [Fragment])
            | "CommitShards"
            >> beam.ParDo(_CommitShard(cfg), vocabularies, *side).with_outputs(_CommitShard.STATS, main="shards")
        )
        # shards: {"split", "shard", "path", "records", "bytes", "blocks", "index", "fingerprint"} of a shard in
        # the temp dir;
        # STATS: a blocks shard's statistics, packed
        # Global merges without CombineGlobally's defaults: the side inputs give the merge
        # of nothing instead. Its default-value branch made the pipeline slower to build
        # and run: with an Impulse for Create([None]) below, a 100-row job took 0.23 s
        # instead of 0.30 s (median of 12), a fixed cost of every job.
        stats = (
            (converted[_ConvertFiles.STATS], shards[_CommitShard.STATS])
            | "AllStats" >> beam.Flatten()
            | "MergeStats" >> beam.CombineGlobally(ConversionStats.merge_packed).without_defaults()
        )
        # one ConversionStats, packed (bytes)
        finalize_side = [
            beam.pvalue.AsList(shards.shards),
            _total_of(stats, ConversionStats.merge_packed),
            beam.pvalue.AsList(converted[_ConvertFiles.QUARANTINE]),
            vocabularies,
        ]
        if type_counts is not None:
            finalize_side.append(_total_of(type_counts, cfg.source.merge_type_counts))
        return (
            files.pipeline
            | "FinalizeTrigger" >> beam.Impulse()
            | "Finalize" >> beam.Map(_finalize, cfg, *finalize_side)
            # the metadata's JSON text
        )
