"""Cutting a CSV byte stream into whole records, the way pyarrow's parser reads them.

Left to itself, pyarrow's reader lets a quote left open swallow every line after it into
one cell, and aborts the file at a record longer than its parse block. So the job finds
the records itself, in numpy over each block of bytes, and hands pyarrow only whole,
well-formed records, with the physical line each one starts on (`_sources`).

Quoting is pyarrow's (and RFC 4180's): a quote opens a quoted field only as the field's
first character; inside one, `""` is a quote and a lone quote closes it; anywhere else a
quote is a plain character (`55" screen`). A record ends at LF, CRLF or a lone CR outside
quotes; an empty record is no row.

By default a quoted field may not span lines (BigQuery's allowQuotedNewlines, Spark's
multiLine and pyarrow's newlines_in_values are all off by default): a line whose quote is
still open at its end is set aside (`unterminated_quote`) and the next line is read as
usual. With `multiline`, a quoted field may hold newlines, and a quote still open at the
end of the input is an error naming the line it opened on.

Records are found in numpy, over runs of quotes (`_scan`); only a record over the size
cap, read past a block at a time, is walked quote by quote in Python (`_Walker`).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

__all__ = ["Records", "BadRecord", "RecordReader", "EXCERPT_BYTES"]

_QUOTE, _LF, _CR = ord('"'), ord("\n"), ord("\r")
_BOM = b"\xef\xbb\xbf"
EXCERPT_BYTES = 1000  # of a too-large record, kept for the quarantine
_EVENTS = np.zeros(256, bool)
_EVENTS[[_QUOTE, _LF, _CR]] = True


@dataclasses.dataclass(frozen=True)
class BadRecord:
    line: int
    kind: str  # "unterminated_quote" | "too_large"
    text: bytes  # the record without its line end; only its first EXCERPT_BYTES if too large
    size: int  # bytes in the record


@dataclasses.dataclass
class Records:
    data: bytes  # whole records with their line ends (the input's last may lack one)
    starts: np.ndarray  # offset in `data` of each non-empty record
    lines: np.ndarray  # physical line each non-empty record starts on
    bad: list  # BadRecord left out of `data`


class RecordReader:
    """Iterates over a binary stream as blocks of about `block_size` bytes of whole records.

    `first_line`: the physical line of the stream's first byte; `file_start`: the stream
    starts the file (a UTF-8 byte-order mark there is dropped, as pyarrow does).
    A record over `max_record_bytes` is set aside (`too_large`) without being held whole.
    """

    def __init__(
        self,
        f,
        *,
        path: str,
        delimiter: str,
        multiline: bool,
        block_size: int,
        max_record_bytes: int,
        first_line: int = 1,
        file_start: bool = True,
    ):
        self._f = f
        self._path = path
        self._delim = delimiter.encode("utf-8")[0]
        self._multiline = multiline
        self._block = block_size
        self._cap = max_record_bytes
        self._line = first_line  # line of the buffer's first byte
        self._file_start = file_start

    def __iter__(self) -> Iterator[Records]:
        buf = b""  # starts at a record start
        eof = False
        want = self._block
        while not eof:
            more = self._read(want, buf)
            eof = not more
            if self._file_start and more:
                buf += more
                if len(buf) < len(_BOM) and not eof:
                    continue
                buf = buf[len(_BOM) :] if buf.startswith(_BOM) else buf
                self._file_start = False
            else:
                buf += more
            b = np.frombuffer(buf, np.uint8)
            ends, unterminated, open_at, lf = _scan(b, self._delim, self._multiline, eof)
            if open_at is not None:
                raise ValueError(self._open_at_eof(self._line + int(np.searchsorted(lf, open_at))))
            if len(ends):
                cut = int(ends[-1])
                yield self._records(buf, b, ends, unterminated, lf)
                self._line += int(np.searchsorted(lf, cut))
                buf = buf[cut:]
            want = self._block
            if len(buf) > self._cap and not eof:
                skipped, buf = self._skip(buf)
                yield Records(b"", np.zeros(0, np.int64), np.zeros(0, np.int64), [skipped])
            elif len(buf) >= self._block:
                # A long record: read as much again, so rescanning it stays linear, but
                # only as far as needed to see it pass the cap.
                want = max(self._block, min(len(buf), self._cap + 1 - len(buf)))

    def _read(self, size: int, buf: bytes) -> bytes:
        """Reads on from the stream; `buf`: the bytes read but not handed on, for errors."""
        try:
            return self._f.read(size)
        except (OSError, ValueError, EOFError) as e:  # pyarrow's ArrowInvalid is a ValueError
            hint = (
                "the gzip stream is truncated or corrupt; re-create or re-download the file, or leave it out of --input"
                if self._path.endswith(".gz")
                else "re-create or re-download the file, or leave it out of --input"
            )
            lines = self._line - 1 + buf.count(b"\n")
            raise ValueError(f"input file {self._path}: reading failed after line {lines} ({e}): {hint}") from e

    def _records(
        self, buf: bytes, b: np.ndarray, ends: np.ndarray, unterminated: np.ndarray, lf: np.ndarray
    ) -> Records:
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        sizes = ends - starts
        # Content without the line end: LF, CRLF, a lone CR, or none at the end of the input.
        last = np.maximum(ends - 1, 0)
        content = sizes - ((b[last] == _LF) | (b[last] == _CR))
        crlf = (b[last] == _LF) & (content > 0)
        crlf[crlf] &= b[np.maximum(last[crlf] - 1, 0)] == _CR
        content -= crlf
        k = min(len(lf), len(ends))
        if len(ends) - k <= 1 and np.array_equal(ends[:k], lf[:k] + 1):
            lines = self._line + np.arange(len(ends))  # every record but the input's last ends at an LF
        else:
            lines = self._line + np.searchsorted(lf, starts)
        too_large = sizes > self._cap
        bad = unterminated | too_large
        keep = (content > 0) & ~bad
        if not bad.any():
            return Records(buf[: int(ends[-1])], starts[keep], lines[keep], [])
        pieces, out, removed, begin = [], [], 0, 0
        shift = np.zeros(len(starts), np.int64)
        for i in np.flatnonzero(bad):
            s, e = int(starts[i]), int(ends[i])
            pieces.append(buf[begin:s])
            text = buf[s : s + int(content[i])]
            kind = "too_large" if too_large[i] else "unterminated_quote"
            out.append(BadRecord(int(lines[i]), kind, text[:EXCERPT_BYTES] if too_large[i] else text, int(sizes[i])))
            removed += e - s
            shift[i + 1 :] = removed
            begin = e
        pieces.append(buf[begin : int(ends[-1])])
        return Records(b"".join(pieces), (starts - shift)[keep], lines[keep], out)

    def _skip(self, buf: bytes):
        """Reads past the record that starts `buf` and is over the size cap, holding only
        a block of it at a time. -> (its BadRecord, the bytes after it)."""
        line, excerpt, size = self._line, buf[:EXCERPT_BYTES], 0
        walker = _Walker(self._delim, self._multiline)
        open_line, lo, eof = None, 0, False
        while True:
            walker.opened_at = None
            ends, _, stop = walker.walk(np.frombuffer(buf, np.uint8), lo, eof, first_only=True)
            if walker.opened_at is not None:
                open_line = self._line + buf.count(b"\n", 0, walker.opened_at)
            if ends:
                size += ends[0]
                self._line += buf.count(b"\n", 0, ends[0])
                return BadRecord(line, "too_large", excerpt, size), buf[ends[0] :]
            if eof:
                if walker.inside and self._multiline:
                    raise ValueError(self._open_at_eof(open_line))
                return BadRecord(line, "too_large", excerpt, size + len(buf)), b""
            # Drop what was walked, but keep the byte before `stop` (the state's context)
            # and any byte the walker could not decide on without the next one.
            keep = max(stop - 1, 0)
            size += keep
            self._line += buf.count(b"\n", 0, keep)
            more = self._read(self._block, buf)
            eof = not more
            buf, lo = buf[keep:] + more, 1 if stop >= 1 else 0

    def _open_at_eof(self, line: int) -> str:
        return (
            f"input file {self._path}: the quote that opens a field on line {line} is not closed by the end of the "
            "file (--allow_quoted_newlines lets quoted fields span lines): close it, and write a quote inside a "
            'quoted field twice ("")'
        )


def _scan(b: np.ndarray, delim: int, multiline: bool, eof: bool):
    """The records of `b`, which starts at a record start.

    -> (ends, unterminated, open_at, lf): the offset just past each whole record (at the
    end of the input, also past a last record without line end); per record, whether a
    quote is still open at its line end (default mode); with `multiline` at the end of
    the input, the offset of the quote left open, else None; the offsets of `b`'s LFs.
    """
    n = len(b)
    # LF, CR and the quote all sort at or below the quote: one pass over the bytes finds
    # them (and the few other bytes there, mostly spaces), where a pass each cost 3x.
    special = np.flatnonzero(b <= _QUOTE)
    kinds = b[special]
    lf, cr = special[kinds == _LF], special[kinds == _CR]
    inside_before, opener = _quote_state(b, special[kinds == _QUOTE], lf, delim, multiline)
    inside_lf, inside_cr = inside_before(lf), inside_before(cr)
    after = cr + 1
    bare = ~inside_cr & ((after < n) | eof)  # a CR at the end may yet be CRLF's first half
    bare[after < n] &= b[after[after < n]] != _LF
    if multiline:
        terms, flags = lf[~inside_lf], np.zeros(int((~inside_lf).sum()), bool)
    else:
        terms, flags = lf, inside_lf
    if bare.any():
        terms = np.concatenate([terms, cr[bare]])
        flags = np.concatenate([flags, np.zeros(int(bare.sum()), bool)])
        order = np.argsort(terms, kind="stable")
        terms, flags = terms[order], flags[order]
    ends, unterminated = terms + 1, flags
    open_at = None
    if eof and n and (not len(ends) or ends[-1] < n):
        still_open = bool(inside_before(np.array([n]))[0])
        if still_open and multiline:
            open_at = opener()
        ends = np.append(ends, n)
        unterminated = np.append(unterminated, still_open and not multiline)
    return ends.astype(np.int64), unterminated, open_at, lf


def _quote_state(b: np.ndarray, q: np.ndarray, lf: np.ndarray, delim: int, multiline: bool):
    """-> (inside_before, opener): `inside_before(x)` tells, for sorted offsets, whether each
    is inside quotes; `opener()`, where the field still open at the end of `b` opened.
    `q` and `lf`: the offsets of `b`'s quotes and LFs.

    The state machine is run over runs of quotes, not bytes: outside quotes, a run that
    starts a field opens one and then holds pairs ("") and perhaps a closing quote; inside,
    a run holds pairs and perhaps a closing quote; elsewhere a run is plain text. So a run
    of even length changes nothing, an odd one at a field start toggles the state, and an
    odd one elsewhere leaves it outside ("reset"). In default mode every LF resets too.
    The state at an offset is the parity of the toggles since the last reset. Commonly
    every reset closes a field (and, by default, every line closes its quotes): then the
    state is just the parity of the odd runs before the offset.
    """
    if not q.size:
        return (lambda x: np.zeros(len(x), bool)), None
    first = np.ones(q.size, bool)
    first[1:] = np.diff(q) != 1
    starts = np.flatnonzero(first)
    if starts.size == q.size:  # no quote next to another (no ""): every run is one odd quote
        odd_runs = q
    else:
        odd = np.diff(np.append(starts, q.size)) % 2 == 1
        odd_runs = q[starts[odd]]
    prev = b[np.maximum(odd_runs - 1, 0)]
    toggle = (odd_runs == 0) | (prev == delim) | (prev == _LF) | (prev == _CR)
    # If every odd run flipped the state, the runs at even ranks would open a field: each
    # must be at a field start.
    parity_holds = bool(toggle[0::2].all())
    before_lf = np.searchsorted(odd_runs, lf)
    if parity_holds and not multiline:
        parity_holds = not (np.diff(before_lf, prepend=0) % 2).any()  # every line ends outside quotes
    if parity_holds:

        def parity(x):
            return (before_lf if x is lf else np.searchsorted(odd_runs, x)) % 2 == 1

        return parity, lambda: int(odd_runs[-1])
    toggles, resets = odd_runs[toggle], odd_runs[~toggle]

    def inside_before(x):
        last = _last_before(resets, x)
        if not multiline:
            last = np.maximum(last, np.concatenate([[-1], lf[:-1]]) if x is lf else _last_before(lf, x))
        since = np.searchsorted(toggles, x) - np.where(last >= 0, np.searchsorted(toggles, last), 0)
        return since % 2 == 1

    def opener():  # the last toggle that left the state inside
        return int(toggles[inside_before(toggles + 1)][-1])

    return inside_before, opener


def _last_before(sorted_positions: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each x, the largest position below it, or -1."""
    i = np.searchsorted(sorted_positions, x) - 1
    return np.where(i >= 0, sorted_positions[np.maximum(i, 0)] if sorted_positions.size else -1, -1)


class _Walker:
    """The quote state machine, walked one quote or line end at a time; its state carries
    over from one call to the next."""

    def __init__(self, delim: int, multiline: bool):
        self._delim = delim
        self._multiline = multiline
        self.inside = False
        self.opened_at = None  # where the quoted field open now began

    def walk(self, b: np.ndarray, lo: int, eof: bool, *, first_only: bool = False):
        """Walks b[lo:]. -> (ends, unterminated, stop): the offset just past each record end
        found, whether its line ended inside quotes, and where walking stopped: len(b), or
        a quote or CR at the end of `b` that needs the next byte (before eof)."""
        n = len(b)
        ends, flags = [], []
        events = np.flatnonzero(_EVENTS[b[lo:]]) + lo
        k, m = 0, len(events)
        while k < m:
            p = int(events[k])
            c = b[p]
            if c == _QUOTE:
                if self.inside:
                    if p + 1 >= n and not eof:
                        return ends, flags, p
                    if p + 1 < n and b[p + 1] == _QUOTE:
                        k += 2  # "" inside quotes: one quote
                        continue
                    self.inside = False
                elif p == 0 or b[p - 1] in (self._delim, _LF, _CR):
                    self.inside, self.opened_at = True, p
            elif c == _LF:
                if not (self.inside and self._multiline):
                    ends.append(p + 1)
                    flags.append(self.inside)
                    self.inside = False
                    if first_only:
                        return ends, flags, p + 1
            elif not self.inside:  # CR outside quotes: a line end, unless the first half of CRLF
                if p + 1 >= n and not eof:
                    return ends, flags, p
                if p + 1 >= n or b[p + 1] != _LF:
                    ends.append(p + 1)
                    flags.append(False)
                    if first_only:
                        return ends, flags, p + 1
            k += 1
        return ends, flags, n
