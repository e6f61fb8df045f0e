"""Hostile CSV input through the real job: nothing is lost, bent or silently re-typed."""

from __future__ import annotations

import gzip
import logging
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_jobs.sources import readers
from tests.conftest import examples, quarantine_lines, read_examples, run_convert, write_text


def _run(src, out, *args):
    return run_convert("--source", "csv", "--input", src, "--output", out, *args)


# --- quoted fields and lines (item 5) -------------------------------------------------


def _unterminated_corpus(path, rows=2000):
    """id,name,score; row `rows // 2` opens a quote it never closes; a blank line and a
    bad number come after it, so line numbers must stay physical past all three."""
    lines = ["id,name,score"] + [f"{i},n{i},{i}.5" for i in range(rows)]
    mid = rows // 2
    lines[mid + 1] = f'{mid},"never closed,{mid}.5'
    lines[mid + 3] = ""  # a blank line
    lines[mid + 200] = f"{mid + 199},n,not-a-number"
    return write_text(path, "\n".join(lines) + "\n")


@pytest.mark.parametrize("split_mb", ["0", "0.004"])
def test_unterminated_quote_is_quarantined_by_line_and_the_next_lines_are_read(tmp, caplog, split_mb):
    src = _unterminated_corpus(tmp / "in" / "a.csv")
    caplog.set_level(logging.INFO, logger="beam_jobs")
    info = _run(src, tmp / "out", "--column", "score:float32", "--max_bad_fraction", "0.01", "--csv_split_mb", split_mb)
    if split_mb != "0":  # default mode: every newline ends a record, so ranges are always safe
        assert re.search(r"reading \d+ byte ranges in parallel", caplog.text)
    ids = sorted(r["id"][0] for r in read_examples(tmp / "out"))
    assert ids == [i for i in range(2000) if i not in (1000, 1002, 1199)]
    bad = sorted(quarantine_lines(tmp / "out"), key=lambda b: b["row"])
    # Physical lines, header = 1: data row i is on line i + 2; the blank line 1004 is no record.
    assert [(b["row"], b["kind"]) for b in bad] == [(1002, "unterminated_quote"), (1201, "type")]
    assert bad[0]["raw"] == '1000,"never closed,1000.5' and "line" in bad[0]["reason"]
    assert info.quarantine["reasons"] == {"unterminated_quote": 1, "type": 1}
    assert info.source["rows"] == 1999


def test_quote_left_open_at_the_end_of_the_file_with_quoted_newlines_names_its_line(tmp):
    body = 'a,b\n1,x\n2,"two\nlines"\n3,"opened here\n4,y\n5,z\n'
    src = write_text(tmp / "in" / "a.csv", body)
    with pytest.raises(
        Exception, match=r"a\.csv: the quote that opens a field on line 5 is not closed by the end of the file"
    ):
        _run(src, tmp / "out", "--allow_quoted_newlines")


def test_quoted_newlines_are_opt_in(tmp):
    src = write_text(tmp / "in" / "a.csv", 'a,b\n1,"two\nlines"\n2,x\n')
    info = _run(src, tmp / "on", "--allow_quoted_newlines")
    assert sorted(r["b"][0] for r in read_examples(tmp / "on")) == [b"two\nlines", b"x"]
    assert info.quarantine["records"] == 0
    # By default a quote may not span lines: its line is quarantined, the next is read as a row.
    src = write_text(tmp / "in2" / "a.csv", 'a,b\n1,"two\nlines"\n' + "".join(f"{i},x\n" for i in range(2, 3000)))
    _run(src, tmp / "off")
    assert [(b["row"], b["kind"]) for b in quarantine_lines(tmp / "off")] == [
        (2, "unterminated_quote"),
        (3, "field_count"),
    ]
    assert len(read_examples(tmp / "off")) == 2998


def test_literal_quotes_inside_unquoted_fields_are_not_unterminated(tmp):
    # A quote that does not open a field (inch marks) is a plain character, as for pyarrow.
    lines = ["item,size"] + [f'tv{i},{i}" screen' for i in range(50)] + ['"a ""quoted"" name",7"']
    src = write_text(tmp / "in" / "a.csv", "\n".join(lines) + "\n")
    info = _run(src, tmp / "out")
    assert info.quarantine["records"] == 0
    sizes = {r["item"][0]: r["size"][0] for r in read_examples(tmp / "out")}
    assert sizes[b"tv3"] == b'3" screen' and sizes[b'a "quoted" name'] == b'7"'


# --- integers and floats (items 6-9) --------------------------------------------------


def test_19_digit_ids_stay_int64_when_a_stray_cell_is_quarantined(tmp):
    ids = [9_000_000_000_000_000_000 + i * 7 for i in range(5000)]
    src = write_text(tmp / "in" / "a.csv", "id\n" + "".join(f"{v}\n" for v in ids) + "oops\n")
    info = _run(src, tmp / "out", "--max_bad_fraction", "0.01")
    assert info.feature("id").dtype == "int64"
    assert sorted(r["id"][0] for r in read_examples(tmp / "out")) == ids
    assert [b["raw"] for b in quarantine_lines(tmp / "out")] == ["oops"]


def test_integers_beyond_int64_make_the_column_text(tmp):
    ids = [10**19 + i for i in range(3000)]  # 20 digits
    src = write_text(tmp / "in" / "a.csv", "id\n" + "".join(f"{v}\n" for v in ids) + "oops\n")
    info = _run(src, tmp / "out")
    assert info.feature("id").dtype == "bytes"
    assert sorted(int(r["id"][0]) for r in read_examples(tmp / "out") if r["id"][0] != b"oops") == ids


def test_large_integers_with_a_decimal_cell_become_float64_not_float32(tmp):
    ids = [123_456_789_000 + i for i in range(3000)]  # float32 would merge them, float64 holds each
    src = write_text(
        tmp / "in" / "a.csv", "id,small\n" + "".join(f"{v},{i}\n" for i, v in enumerate(ids)) + "1.5,0.5\n"
    )
    info = _run(src, tmp / "out")
    assert info.feature("id").dtype == "float64"
    assert info.feature("small").dtype == "float32"  # integers up to 2**24 are exact in float32
    rows = read_examples(tmp / "out")
    assert sorted(r["id"][0] for r in rows) == [1.5] + [float(v) for v in ids]
    assert sorted(r["small"][0] for r in rows)[-1] == 2999.0


def test_integers_float64_would_merge_with_a_decimal_cell_become_text(tmp):
    ids = [2**60 + 1 + 2 * i for i in range(50)]  # odd, beyond 2**53: float64 would merge them
    src = write_text(tmp / "in" / "a.csv", "id\n" + "".join(f"{v}\n" for v in ids) + "1.5\n")
    info = _run(src, tmp / "out")
    assert info.feature("id").dtype == "bytes"
    assert len({r["id"][0] for r in read_examples(tmp / "out")}) == 51


def test_leading_zeros_keep_a_column_text_unless_a_type_is_given(tmp):
    src = write_text(
        tmp / "in" / "a.csv", "zip,n\n" + "".join(f"{i:05d},{i}\n" for i in range(0, 3000, 11)) + "-012,0\n"
    )
    info = _run(src, tmp / "out")
    assert info.feature("zip").dtype == "bytes" and info.feature("n").dtype == "int64"
    zips = {r["zip"][0] for r in read_examples(tmp / "out")}
    assert b"02134" in zips and b"00000" in zips and b"-012" in zips
    info = _run(src, tmp / "forced", "--column", "zip:int64")
    assert info.feature("zip").dtype == "int64"
    assert {r["zip"][0] for r in read_examples(tmp / "forced")} >= {2134, 0, -12}


def test_int64_extremes_are_kept_when_another_cell_of_the_chunk_is_bad(tmp):
    cells = [
        "9223372036854775807",
        "-9223372036854775808",
        "+5",
        " 7 ",
        "0009223372036854775807",
        "9223372036854775808",
        "12x",
    ]
    src = write_text(tmp / "in" / "a.csv", "n\n" + "\n".join(cells) + "\n")
    _run(src, tmp / "out", "--column", "n:int64", "--max_bad_fraction", "0.5")
    assert sorted(r["n"][0] for r in read_examples(tmp / "out")) == sorted([2**63 - 1, -(2**63), 5, 7, 2**63 - 1])
    bad = {b["raw"]: b["reason"] for b in quarantine_lines(tmp / "out")}
    assert set(bad) == {"9223372036854775808", "12x"}
    assert re.search(r"'9223372036854775808' is out of int64's range", bad["9223372036854775808"])
    assert "'12x' is not a valid int64" in bad["12x"]


@pytest.mark.parametrize("stray", [False, True], ids=["clean-column", "with-a-bad-cell"])
def test_finite_floats_beyond_float32_are_quarantined_and_inf_nan_are_kept(tmp, stray):
    cells = ["1.5", "1e400", "-3.5e38", "inf", "-Infinity", "nan", "3.4e38", "1e-3"] + ["oops"] * stray
    src = write_text(tmp / "in" / "a.csv", "x\n" + "\n".join(cells) + "\n")
    _run(src, tmp / "out", "--column", "x:float32", "--max_bad_fraction", "0.5")
    values = [r["x"][0] for r in read_examples(tmp / "out")]
    assert len(values) == 6
    assert sorted(str(v) for v in values if v != v or abs(v) == float("inf")) == ["-inf", "inf", "nan"]
    assert any(abs(v - 3.4e38) < 1e32 for v in values)
    bad = {b["raw"]: b for b in quarantine_lines(tmp / "out")}
    assert set(bad) == {"1e400", "-3.5e38"} | ({"oops"} if stray else set())
    assert bad["1e400"]["kind"] == "type" and "beyond float32's range" in bad["1e400"]["reason"]


def test_inference_counts_floats_beyond_float32_as_strays(tmp):
    src = write_text(tmp / "in" / "a.csv", "x\n" + "".join(f"{i}.25\n" for i in range(3000)) + "5e38\n")
    info = _run(src, tmp / "out")
    assert info.feature("x").dtype == "float32"
    assert [b["raw"] for b in quarantine_lines(tmp / "out")] == ["5e38"]
    src = write_text(tmp / "in2" / "a.csv", "x\n" + "".join(f"{i}e300\n" for i in range(1, 3000)))
    assert _run(src, tmp / "o2").feature("x").dtype == "bytes"


# --- very large rows (item 11) --------------------------------------------------------


@pytest.mark.slow
def test_a_row_larger_than_the_parse_block_is_converted(tmp):
    big = "x" * (9 << 20)
    lines = ["id,text"] + [f"{i},t{i}" for i in range(3000)]
    lines[1500] = f'1499,"{big}"'
    src = write_text(tmp / "in" / "a.csv", "\n".join(lines) + "\n")
    _run(src, tmp / "out")
    rows = {r["id"][0]: r["text"][0] for r in read_examples(tmp / "out")}
    assert sorted(rows) == list(range(3000))
    assert rows[1499] == big.encode() and rows[1500] == b"t1500"


def test_a_row_over_the_record_size_cap_is_quarantined_as_too_large(tmp, monkeypatch):
    monkeypatch.setattr(readers, "MAX_RECORD_BYTES", 1 << 20)
    lines = ["id,text"] + [f"{i},t{i}" for i in range(3000)]
    lines[1000] = "999," + "y" * (3 << 20)
    src = write_text(tmp / "in" / "a.csv", "\n".join(lines) + "\n")
    info = _run(src, tmp / "out")
    assert sorted(r["id"][0] for r in read_examples(tmp / "out")) == [i for i in range(3000) if i != 999]
    [bad] = quarantine_lines(tmp / "out")
    assert (bad["row"], bad["kind"]) == (1001, "too_large")
    assert "1 MB" in bad["reason"] and bad["raw"].startswith("999,yyy") and len(bad["raw"]) < 10_000
    assert info.quarantine["reasons"] == {"too_large": 1}


# --- errors that name the file (item 18) ----------------------------------------------


def test_utf16_input_is_refused_at_launch_naming_the_file_and_the_fix(tmp):
    write_text(tmp / "in" / "a.csv", "a,b\n1,2\n", encoding="utf-16")
    with pytest.raises(ValueError, match=r"a\.csv .*UTF-16.*must be UTF-8.*iconv"):
        _run(tmp / "in" / "a.csv", tmp / "out")
    assert not os.path.exists(tmp / "out")  # refused before the job claimed the directory


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_a_header_in_latin1_or_cp1252_is_refused_naming_the_file_and_the_fix(tmp, encoding):
    path = tmp / "a.csv"
    path.write_bytes("café,€uro\n1,2\n".encode(encoding, errors="replace"))
    with pytest.raises(ValueError, match=r"a\.csv: the header \(line 1\) is not UTF-8 .*iconv -f CP1252 -t UTF-8"):
        run_convert("--source", "csv", "--input", path, "--output", tmp / "out")
    assert not os.path.exists(tmp / "out")


def test_parquet_given_as_csv_is_named_parquet(tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1, 2]}), tmp / "data.csv")
    with pytest.raises(ValueError, match=r"data\.csv is a Parquet file .*use --source parquet"):
        run_convert("--source", "csv", "--input", tmp / "data.csv", "--output", tmp / "out")


def test_truncated_gzip_names_the_file_the_line_and_the_fix(tmp):
    data = gzip.compress(("a,b\n" + "".join(f"{i},{i}\n" for i in range(200_000))).encode())
    path = tmp / "in" / "a.csv.gz"
    os.makedirs(path.parent)
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(Exception, match=r"a\.csv\.gz.* after line \d+.*gzip.*truncated or corrupt.*re-download"):
        _run(path, tmp / "out")


def test_an_empty_header_name_is_refused_at_launch(tmp):
    src = write_text(tmp / "in" / "a.csv", "a,,c\n1,2,3\n")
    with pytest.raises(ValueError, match=r"a\.csv: header column 2 has no name.*name every column"):
        _run(src, tmp / "out")
    assert not os.path.exists(tmp / "out")


# --- the record scanner, against a byte-by-byte reference -------------------------------


def _reference_records(data: bytes, multiline: bool, cap: int):
    """pyarrow's quoting, one byte at a time: [(line, text, kind)], kind None for a good
    record; "open" for a quote left open at the end with `multiline`."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    out, n, i, line = [], len(data), 0, 1
    state, start, start_line = "S", 0, 1  # S field start, F unquoted, Q quoted, E quote seen in Q

    def end(stop, after, kind=None):
        kind = "too_large" if after - start > cap else kind
        if data[start:stop] or kind:
            out.append((start_line, None if kind == "too_large" else data[start:stop], kind))

    while i < n:
        c = data[i : i + 1]
        if state == "Q":
            if c == b'"':
                state = "E"
            elif c == b"\n":
                line += 1
                if not multiline:
                    end(i - (i > start and data[i - 1 : i] == b"\r"), i + 1, "unterminated_quote")
                    state, start, start_line = "S", i + 1, line
        elif c in (b"\n", b"\r"):
            stop = i
            if c == b"\r" and data[i + 1 : i + 2] == b"\n":
                i += 1
            line += data[i : i + 1] == b"\n"
            end(stop, i + 1)
            state, start, start_line = "S", i + 1, line
        elif c == b'"':
            state = "Q" if state in ("S", "E") else "F"
        else:
            state = "S" if c == b"," else "F"
        i += 1
    if start < n:
        if state == "Q" and multiline:
            return "open"
        end(n - (state == "Q" and data[n - 1 :] == b"\r"), n, "unterminated_quote" if state == "Q" else None)
    return sorted(out, key=lambda r: (r[0], str(r[2])))


def _scanned_records(data: bytes, multiline: bool, block: int, cap: int):
    import io

    from beam_jobs.sources.csv_records import RecordReader

    reader = RecordReader(
        io.BytesIO(data), path="x.csv", delimiter=",", multiline=multiline, block_size=block, max_record_bytes=cap
    )
    out = []
    try:
        for r in reader:
            ends = list(r.starts[1:]) + [len(r.data)]
            for start, end, line in zip(r.starts, ends, r.lines):
                out.append((int(line), r.data[start:end], None))
            out += [(b.line, None if b.kind == "too_large" else b.text, b.kind) for b in r.bad]
    except ValueError as e:
        assert re.search(r"x\.csv: the quote that opens a field on line \d+ is not closed", str(e))
        return "open"
    # A good record's text runs on to the next one's start (empty lines included).
    return sorted(
        ((line, text if kind else text.rstrip(b"\r\n"), kind) for line, text, kind in out),
        key=lambda r: (r[0], str(r[2])),
    )


_NOISE = st.binary(max_size=80).map(lambda b: bytes(b'ab,"\r\n\n \t'[x % 9] for x in b))
# Mostly well-formed fields (where quote parity alone decides), with the odd stray quote.
_CELL = st.sampled_from(["a", '"a,b"', '"x""y"', '""', '"\r"', '"l\nm"', '"""', 'c"', '"'])
_LINES = st.lists(
    st.tuples(st.lists(_CELL, min_size=1, max_size=3), st.sampled_from(["\n", "\r\n", "\r", ""])), max_size=8
)
_STRUCTURED = _LINES.map(lambda lines: "".join(",".join(cells) + eol for cells, eol in lines).encode())


@settings(max_examples=examples(1500), deadline=None)
@given(
    st.one_of(_NOISE, _STRUCTURED),
    st.booleans(),
    st.sampled_from([1, 2, 3, 7, 64, 4096]),
    st.sampled_from([3, 8, 20, 1 << 30]),
)
def test_records_are_cut_as_a_byte_by_byte_reference_cuts_them(data, multiline, block, cap):
    expected = _reference_records(data, multiline, cap)
    if expected != "open":
        expected = [(line, text if kind else text.rstrip(b"\r\n"), kind) for line, text, kind in expected]
    assert _scanned_records(data, multiline, block, cap) == expected
