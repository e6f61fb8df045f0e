"""Reading one CSV file as byte ranges, each by a different worker.

A range [start, end) holds the records that *begin* inside it: its reader seeks to
start - 1, skips to just past the first newline, and reads on past `end` to the end of
the line that straddles it (Hadoop's LineRecordReader rule). Neighbouring ranges agree
on every cut, so each record is read exactly once, CRLF and a last line without a
newline included.

The rule is only right when every newline ends a record. By default it does: a quoted
field may not span lines (`sources.csv_records`). With --allow_quoted_newlines, a quoted field
holding a newline breaks it, so before a file is read as ranges, its ranges are scanned
(in parallel, numpy over the bytes): quote characters and newlines are counted, and for
both possible quote states at a range's start, the first newline inside quotes is
noted. The true state at each range start is the parity of all quotes before it. A file
with a newline inside quotes is read whole by one worker, and the log says so. (The
scan also counts newlines, which give each range's rows their line numbers.)
"""

from __future__ import annotations

import dataclasses
import io
import logging

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from beam_jobs._errors import open_named

__all__ = [
    "CsvRange",
    "RangeScan",
    "plan_ranges",
    "scan_range",
    "decide_ranges",
    "RangeFile",
    "DEFAULT_SPLIT_MB",
    "SplitCsvFiles",
]

logger = logging.getLogger(__name__)

# Beam's own text sources aim at 64 MB bundles: small enough to spread a file over a
# few workers, large enough that per-range setup (open, seek, parser) is noise.
DEFAULT_SPLIT_MB = 64
_SCAN_BLOCK = 8 << 20
_QUOTE, _NEWLINE = ord('"'), ord("\n")


@dataclasses.dataclass(frozen=True)
class CsvRange:
    index: int  # position in its file; range 0 holds the header
    start: int
    end: int
    newlines_before: int  # newlines in [0, start): gives quarantined rows their line numbers


@dataclasses.dataclass(frozen=True)
class RangeScan:
    quotes: int
    newlines: int
    # First newline inside quotes if the range starts outside quotes (0) or inside (1).
    inside_quotes: tuple


def plan_ranges(size: int, split_bytes: int) -> list:
    """[(start, end)] covering [0, size) in near-equal pieces of at most ~split_bytes."""
    if split_bytes <= 0 or size <= split_bytes:
        return [(0, size)]
    n = -(-size // split_bytes)
    cuts = [size * i // n for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def splittable(path: str) -> bool:
    return not path.endswith(".gz")  # a gzip stream can only be read from its start


def scan_range(path: str, start: int, end: int) -> RangeScan:
    quotes = newlines = 0
    inside = [None, None]
    with open_named("--input", path) as f:
        f.seek(start)
        pos = start
        while pos < end:
            block = f.read(min(_SCAN_BLOCK, end - pos))
            if not block:
                break
            buf = np.frombuffer(block, np.uint8)
            q = np.flatnonzero(buf == _QUOTE)
            nl = np.flatnonzero(buf == _NEWLINE)
            if nl.size:
                before = quotes + np.searchsorted(q, nl)  # quotes in the range before each newline
                for parity in (0, 1):
                    if inside[parity] is None:
                        hit = np.flatnonzero((before + parity) % 2 == 1)
                        if hit.size:
                            inside[parity] = pos + int(nl[hit[0]])
            quotes += q.size
            newlines += nl.size
            pos += len(block)
    return RangeScan(quotes, newlines, tuple(inside))


def decide_ranges(path: str, scans, *, quoted_newlines: bool = False) -> list | None:
    """`scans`: [(start, end, RangeScan)] in file order. The ranges to read, or None: whole.

    Unless `quoted_newlines` (--allow_quoted_newlines), every newline ends a record (a
    line left inside quotes is quarantined on its own), so every cut is safe.
    """
    ranges, parity, newlines = [], 0, 0
    for index, (start, end, scan) in enumerate(sorted(scans, key=lambda s: s[0])):
        if quoted_newlines and scan.inside_quotes[parity] is not None:
            logger.info(
                "%s has a newline inside a quoted field (byte %d): reading it whole in one worker, not as %d ranges",
                path,
                scan.inside_quotes[parity],
                len(scans),
            )
            return None
        ranges.append(CsvRange(index, start, end, newlines))
        parity = (parity + scan.quotes) % 2
        newlines += scan.newlines
    logger.info("%s: reading %d byte ranges in parallel", path, len(ranges))
    return ranges


class RangeFile(io.RawIOBase):
    """The bytes of the records that begin in [start, end) of an open file."""

    _PROBE = 64 << 10

    def __init__(self, raw, start: int, end: int):
        super().__init__()
        self._raw = raw
        self._end = end
        self.skipped_partial_line = False
        begin = 0
        if start > 0:
            newline = self._next_newline(start - 1)
            begin = newline + 1 if newline is not None else None
            self.skipped_partial_line = newline is not None and newline >= start
            if newline is None or newline >= end - 1:
                begin = None  # the line that straddles `start` also straddles `end`: no record begins here
        self._done = self.empty = begin is None
        self._pos = begin or 0
        if not self._done:
            raw.seek(self._pos)

    def _next_newline(self, pos: int):
        self._raw.seek(pos)
        while block := self._raw.read(self._PROBE):
            i = block.find(b"\n")
            if i >= 0:
                return pos + i
            pos += len(block)
        return None

    def readable(self):
        return True

    def read(self, size=-1):
        if self._done:
            return b""
        data = self._raw.read(size if size and size > 0 else 1 << 20)
        if not data:
            self._done = True
            return b""
        tail = self._end - 1 - self._pos  # the first newline at or after end - 1 closes the range
        if self._pos + len(data) > self._end - 1:
            i = data.find(b"\n", max(tail, 0))
            if i >= 0:
                data = data[: i + 1]
                self._done = True
        self._pos += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class SplitCsvFiles(beam.PTransform):
    """(file index, path, None) -> (file index, path, CsvRange | None): files larger than
    `split_bytes` become byte ranges, unless a scan finds newlines inside quoted fields."""

    def __init__(self, sizes: tuple, split_bytes: int, quoted_newlines: bool):
        super().__init__()
        self._sizes, self._split_bytes, self._quoted_newlines = sizes, split_bytes, quoted_newlines

    def expand(self, files):
        planned = files | "PlanRanges" >> beam.FlatMap(_plan_ranges, self._sizes, self._split_bytes).with_outputs(
            "scan", main="whole"
        )
        decided = (
            planned.scan
            # (file index, path, start, end)
            | "ScanRanges" >> beam.Map(lambda r: ((r[0], r[1]), (r[2], r[3], scan_range(*r[1:]))))
            | "ByFile" >> beam.GroupByKey()
            | "DecideRanges" >> beam.FlatMap(_decided_ranges, self._quoted_newlines)
        )
        return (planned.whole, decided) | "AllParts" >> beam.Flatten() | "SpreadParts" >> beam.Reshuffle()


def _plan_ranges(item, sizes, split_bytes):
    index, path, _ = item
    ranges = plan_ranges(sizes[index], split_bytes) if splittable(path) else [(0, sizes[index])]
    if len(ranges) == 1:
        yield (index, path, None)
        return
    for start, end in ranges:
        yield beam.pvalue.TaggedOutput("scan", (index, path, start, end))


def _decided_ranges(element, quoted_newlines):
    (index, path), scans = element
    ranges = decide_ranges(path, list(scans), quoted_newlines=quoted_newlines)
    Metrics.counter("ingest", "csv_files_read_as_ranges" if ranges else "csv_files_read_whole").inc()
    for r in ranges or [None]:
        yield (index, path, r)
