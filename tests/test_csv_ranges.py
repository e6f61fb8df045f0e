"""Reading one CSV file as byte ranges: every record exactly once, whatever the cuts."""

from __future__ import annotations

import io
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_jobs.sources import readers
from beam_jobs.sources.csv_ranges import RangeFile, decide_ranges, plan_ranges, scan_range
from tests.conftest import examples, quarantine_lines, read_examples, run_convert

_FIELD = st.one_of(
    st.text(alphabet="abc xyz1", max_size=6),
    st.text(alphabet='ab,"é\r', max_size=6).map(
        lambda s: '"' + s.replace('"', '""') + '"'
    ),  # quoted: commas, quotes, CR
)


@st.composite
def _csv_bytes(draw, newlines_in_quotes=False, stray_quotes=False):
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    rows = ["a,b,c"]
    for _ in range(draw(st.integers(1, 25))):  # header-only files are an error of their own
        cells = draw(st.lists(_FIELD, min_size=3, max_size=3))
        rows.append(",".join(cells))
    if newlines_in_quotes:
        rows.insert(draw(st.integers(1, len(rows))), f'x,"two{eol}lines",z')
    for _ in range(draw(st.integers(0, 3)) if stray_quotes else 0):
        rows.insert(draw(st.integers(1, len(rows))), draw(st.sampled_from(['x,"open,z', '"a,b', 'x,y,"""'])))
    text = eol.join(rows) + (eol if draw(st.booleans()) else "")  # the last line may lack a newline
    return text.encode("utf-8")


def _read_range(data: bytes, start: int, end: int) -> bytes:
    f = RangeFile(io.BytesIO(data), start, end)
    return b"" if f.empty else f.read(1 << 30) + f.read(1 << 30)


@settings(max_examples=examples(300), deadline=None)
@given(_csv_bytes(), st.integers(1, 80))
def test_ranges_partition_the_file_at_line_ends(data, split):
    ranges = plan_ranges(len(data), split)
    pieces = [_read_range(data, s, e) for s, e in ranges]
    assert b"".join(pieces) == data  # every byte exactly once, in order
    read = [piece for piece in pieces if piece]
    assert all(piece.endswith(b"\n") for piece in read[:-1])  # cut only after a newline


@settings(max_examples=examples(150), deadline=None)
@given(_csv_bytes(), st.integers(1, 60))
def test_rows_read_by_ranges_equal_the_whole_file(tmp_path_factory, data, split):
    path = tmp_path_factory.mktemp("r") / "x.csv"
    path.write_bytes(data)
    header, fmt = ["a", "b", "c"], readers.CsvFormat()
    whole = _rows(str(path), header, fmt, None)
    scans = [(s, e, scan_range(str(path), s, e)) for s, e in plan_ranges(len(data), split)]
    ranges = decide_ranges(str(path), scans)
    assert ranges is not None  # no newline inside quotes: always splittable
    parts = [row for r in ranges for row in _rows(str(path), header, fmt, r)]
    assert parts == whole


def _rows(path, header, fmt, byte_range, bad=None):
    out = []
    for chunk in readers.iter_csv_chunks(path, header, fmt, header, byte_range):
        cells = zip(*(c.to_pylist() for c in chunk.batch.columns))
        out += [(int(r), *row) for r, row in zip(chunk.rows, cells)]
        if bad is not None:
            bad += [(b.row, b.kind, b.raw) for b in chunk.bad]
    return out


@settings(max_examples=examples(150), deadline=None)
@given(_csv_bytes(stray_quotes=True), st.integers(1, 60))
def test_lines_with_an_unclosed_quote_are_set_aside_alike_by_ranges_and_whole(tmp_path_factory, data, split):
    # By default every newline ends a record, so a stray quote never stops the split.
    path = tmp_path_factory.mktemp("u") / "x.csv"
    path.write_bytes(data)
    header, fmt = ["a", "b", "c"], readers.CsvFormat()
    whole_bad, parts_bad = [], []
    whole = _rows(str(path), header, fmt, None, whole_bad)
    ranges = decide_ranges(str(path), [(s, e, scan_range(str(path), s, e)) for s, e in plan_ranges(len(data), split)])
    assert ranges is not None
    assert [row for r in ranges for row in _rows(str(path), header, fmt, r, parts_bad)] == whole
    assert sorted(parts_bad) == sorted(whole_bad)
    lines = data.split(b"\n")
    for row, kind, raw in whole_bad:  # the physical line, as an editor counts it
        if kind == "unterminated_quote":
            assert lines[row - 1].rstrip(b"\r").decode() == raw


@settings(max_examples=examples(100), deadline=None)
@given(_csv_bytes(newlines_in_quotes=True), st.integers(1, 40))
def test_a_newline_inside_quotes_means_the_file_is_read_whole(tmp_path_factory, data, split):
    path = tmp_path_factory.mktemp("q") / "x.csv"
    path.write_bytes(data)
    ranges = plan_ranges(len(data), split)
    decided = decide_ranges(str(path), [(s, e, scan_range(str(path), s, e)) for s, e in ranges], quoted_newlines=True)
    assert decided is None or len(ranges) == 1


def test_plan_ranges_covers_the_file_in_near_equal_pieces():
    assert plan_ranges(100, 0) == [(0, 100)]
    assert plan_ranges(100, 100) == [(0, 100)]
    r = plan_ranges(1000, 300)
    assert r[0][0] == 0 and r[-1][1] == 1000 and all(a[1] == b[0] for a, b in zip(r, r[1:]))
    assert len(r) == 4 and max(e - s for s, e in r) - min(e - s for s, e in r) <= 1


def test_a_range_inside_one_long_line_is_empty():
    data = b"h\n" + b"x" * 100 + b"\nlast\n"
    assert _read_range(data, 10, 50) == b""
    assert _read_range(data, 0, 10) == b"h\n" + b"x" * 100 + b"\n"


# --- the conversion job ---------------------------------------------------------------


def _corpus(path, rows: int, *, quoted_newline=False, crlf=True, bad_row=None):
    eol = "\r\n" if crlf else "\n"
    lines = ["id,name,score"]
    for i in range(rows):
        name = f'"n,{i} ""q"""' if i % 7 == 0 else f"n{i}"
        lines.append(f"{i},{name},{i * 0.5}")
    if bad_row is not None:
        lines[bad_row] = f"{bad_row - 1},oops,not-a-number"
    if quoted_newline:
        lines[rows // 2] = f'{rows // 2 - 1},"two{eol}lines",1.5'
    path.write_bytes(eol.join(lines).encode())  # no newline after the last line
    return path


@pytest.mark.slow
def test_job_reads_ranges_exactly_once_with_crlf_quotes_and_no_final_newline(tmp, caplog):
    src = _corpus(tmp / "in.csv", 3000, bad_row=2500)
    caplog.set_level(logging.INFO, logger="beam_jobs")
    run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "ranges",
        "--csv_split_mb",
        "0.004",
        "--label",
        "id",
        "--max_bad_fraction",
        "0.01",
    )
    assert int(re.search(r"reading (\d+) byte ranges in parallel", caplog.text).group(1)) > 10
    run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "whole",
        "--csv_split_mb",
        "0",
        "--label",
        "id",
        "--max_bad_fraction",
        "0.01",
    )
    ranged, whole = read_examples(tmp / "ranges"), read_examples(tmp / "whole")
    ids = sorted(e["id"][0] for e in ranged)
    assert ids == sorted(e["id"][0] for e in whole) == [i for i in range(3000) if i != 2499]
    names = {e["id"][0]: e["name"][0] for e in ranged}
    assert names[7] == b'n,7 "q"' and names[8] == b"n8"
    quarantined = quarantine_lines(tmp / "ranges")
    assert [(q["row"], q["kind"]) for q in quarantined] == [(2501, "type")]  # physical line, header = 1


def test_job_reads_a_file_with_newlines_in_quotes_whole_and_says_so(tmp, caplog):
    src = _corpus(tmp / "in.csv", 3000, quoted_newline=True, crlf=False)
    caplog.set_level(logging.INFO, logger="beam_jobs")
    run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "out",
        "--csv_split_mb",
        "0.004",
        "--label",
        "id",
        "--allow_quoted_newlines",
    )
    assert "newline inside a quoted field" in caplog.text and "reading it whole" in caplog.text
    examples = read_examples(tmp / "out")
    assert sorted(e["id"][0] for e in examples) == list(range(3000))
    assert any(e["name"] == [b"two\nlines"] for e in examples)


@pytest.mark.slow
def test_ranges_spread_over_two_worker_processes(tmp):
    src = _corpus(tmp / "in.csv", 20000)
    run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "out",
        "--csv_split_mb",
        "0.05",
        "--label",
        "id",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    )
    ids = sorted(e["id"][0] for e in read_examples(tmp / "out"))
    assert ids == list(range(20000))


def test_scan_counts_quotes_and_finds_the_first_newline_in_quotes(tmp):
    path = tmp / "x.csv"
    path.write_bytes(b'a,"b\nc"\n')
    scan = scan_range(str(path), 0, path.stat().st_size)
    assert scan.quotes == 2 and scan.newlines == 2
    assert scan.inside_quotes == (4, 7)  # outside at the start: the first; inside: the other
