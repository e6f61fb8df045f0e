"""The conversion's fast paths write what the plain paths write, byte for byte.

Each test converts the same input twice, once with a fast path and once with it turned
off, through real Beam pipelines, and compares every output file: shards, block indexes,
vocabularies, quarantine lines and the metadata (but its job id and creation time).
Inputs mix high- and low-cardinality text, missing values, empty strings, non-ASCII
text and rows that go to quarantine, over two files and byte ranges.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from beam_jobs.sources import column_types, readers
from beam_jobs.sources import parsed_chunks as _parsed_chunks
from tests.conftest import run_convert


def _corpus_rows(rng, n: int, first: int) -> list:
    words = ["alpha", "beta", "gamma", "δέλτα", "", "NA", "東京", "e,f"]
    lines = []
    for i in range(first, first + n):
        word = words[rng.integers(len(words))]
        url = f"https://ex.example/{rng.integers(1 << 40):x}/ü{i}"  # every value distinct
        num = "" if i % 17 == 0 else f"{rng.normal():.5f}"  # numbers with gaps
        count = "NA" if i % 23 == 0 else str(int(rng.integers(-5, 1 << 20)))
        x, k = f"{rng.normal() * 1e3:.3f}", str(int(rng.integers(-(1 << 40), 1 << 40)))  # none missing
        mix = (
            str(int(rng.integers(100))) if first == 0 else f"{rng.random():.2f}"
        )  # ints in one file, floats in the other
        label = str(i % 3)
        lines.append(f'{num},{count},"{word}",{url},{x},{k},{mix},{label}')
    return lines


def write_corpus(folder, *, rows: int, seed: int, bad: bool = True) -> str:
    """Two CSV files of `rows` rows each (a header each), a few bad rows among them."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for f in range(2):
        lines = _corpus_rows(rng, rows, f * rows)
        if bad:
            lines[rows // 3] = "1.0,2,too,many,fields,here"  # field count
            lines[rows // 2] = "x.5,7,word,https://ex.example/t,1.0,2,3,1"  # not a number: type
            lines[rows // 5] = "0.5,7,word,https://ex.example/bad,1.0,2,3,1"  # invalid UTF-8, below
            lines[rows // 4] = '0.5,3,"open quote,https://ex.example/q,1.0,2,3,2'  # unterminated quote
            lines[rows // 6] = "0.5,3,word,https://ex.example/o,3.5e39,2,3,2"  # x: beyond float32
        data = ("num,count,word,url,x,k,mix,label\n" + "\n".join(lines) + "\n").encode("utf-8")
        if bad:
            data = data.replace(b"/bad,", b"/\xff\xfe,")  # invalid UTF-8
        with open(os.path.join(folder, f"part-{f}.csv"), "wb") as out:
            out.write(data)
    return os.path.join(folder, "part-*.csv")


def output_files(out) -> dict:
    """{relative path: bytes} of a dataset; the metadata without what differs per run, and
    quarantine files by their sorted lines (their names hold a bundle's random id)."""
    files, quarantine = {}, []
    for path in sorted(glob.glob(os.path.join(out, "**", "*"), recursive=True)):
        if os.path.isdir(path):
            continue
        rel = os.path.relpath(path, out)
        with open(path, "rb") as f:
            data = f.read()
        if rel.startswith("quarantine"):
            quarantine += data.splitlines()
        elif rel == "dataset_info.json":
            info = json.loads(data)
            info.pop("created")
            info["source"].pop("job")
            info["quarantine"].pop("files")
            files[rel] = json.dumps(info, sort_keys=True).encode()
        else:
            files[rel] = data
    files["quarantine lines"] = b"\n".join(sorted(quarantine))
    return files


def _convert(src, out, *extra) -> dict:
    run_convert(
        "--source", "csv", "--input", src, "--output", out, "--label", "label", "--max_bad_fraction", "0.5", *extra
    )
    return output_files(out)


@pytest.mark.parametrize("seed, extra", [(1, ()), (2, ("--csv_split_mb", "0.1", "--splits", "train=0.7,eval=0.3"))])
def test_csv_parsed_once_writes_what_parsing_twice_writes(tmp, monkeypatch, seed, extra):
    src = write_corpus(tmp / "in", rows=2500, seed=seed)
    parses = []
    parse_block = readers._parse_block
    monkeypatch.setattr(readers, "_parse_block", lambda *a: parses.append(1) or parse_block(*a))
    once = _convert(src, tmp / "once", *extra)
    blocks = len(parses)
    monkeypatch.setattr(_parsed_chunks.KEPT, "budget", 0)  # nothing fits: every item is read again
    twice = _convert(src, tmp / "twice", *extra)
    assert len(parses) - blocks == 2 * blocks  # the inference pass, then the conversion's
    assert once.keys() == twice.keys()
    assert {k for k in once if once[k] != twice[k]} == set()
    kinds = [json.loads(line)["kind"] for line in once["quarantine lines"].splitlines()]
    assert sorted(kinds) == sorted(["field_count", "type", "type", "unterminated_quote", "utf8"] * 2)
    types = {f["name"]: f["dtype"] for f in json.loads(once["dataset_info.json"])["features"]}
    assert types == dict(
        num="float32", count="int64", word="bytes", url="bytes", x="float32", k="int64", mix="float32", label="int64"
    )


def test_the_job_counts_items_parsed_once_and_again(tmp, monkeypatch):
    from apache_beam.metrics.metric import MetricsFilter

    from beam_jobs import convert

    results, build = [], convert.build_pipeline

    class Kept:  # the job's pipeline, its result kept for its metrics
        def __init__(self, pipeline):
            self.pipeline = pipeline

        def run(self):
            results.append(self.pipeline.run())
            return results[-1]

    monkeypatch.setattr(convert, "build_pipeline", lambda *a, **k: Kept(build(*a, **k)))

    def counts(out):
        _convert(src, out, "--csv_split_mb", "0.1")
        found = results[-1].metrics().query(MetricsFilter().with_namespace("ingest"))["counters"]
        named = {c.key.metric.name: c.committed for c in found}
        return named.get("csv_items_parsed_once", 0), named.get("csv_items_parsed_again", 0)

    src = write_corpus(tmp / "in", rows=2500, seed=3)
    once, again = counts(tmp / "a")
    assert once > 1 and again == 0  # several byte ranges, each kept by this one process
    monkeypatch.setattr(_parsed_chunks.KEPT, "budget", 0)
    assert counts(tmp / "b") == (0, once)


def test_chunks_over_the_budget_are_read_again_and_another_jobs_are_never_taken():
    store = _parsed_chunks.ParsedChunks(budget_bytes=100)

    class Chunk:
        def __init__(self, nbytes):
            self.batch = type("Batch", (), {"nbytes": nbytes})()
            self.casts = {}

    small, large = store.keeper("job1", (0, None)), store.keeper("job1", (1, None))
    small.add(Chunk(40))
    small.add(Chunk(40))
    large.add(Chunk(60))
    large.add(Chunk(60))  # 80 + 120 > 100: this item is let go
    small.publish()
    large.publish()
    assert [c.batch.nbytes for c in store.take("job1", (0, None))] == [40, 40]
    assert store.take("job1", (1, None)) is None
    assert store.take("job1", (0, None)) is None  # taken once
    unfinished = store.keeper("job1", (2, None))
    unfinished.add(Chunk(10))  # never published: its pass failed half-way
    assert store.take("job1", (2, None)) is None
    kept = store.keeper("job1", (3, None))
    kept.add(Chunk(10))
    kept.publish()
    store.keeper("job2", (0, None))  # a new job drops the old one's chunks
    assert store.take("job1", (3, None)) is None and store.held_bytes() == 0


_COLUMNS = {
    "ints": ["1", "-20", "+3", "0", "9223372036854775807"],
    "leading zeros": ["007", "12", "0"],
    "beyond int64": ["1", "99999999999999999999", "3"],
    "floats": ["1.5", "-2e3", "inf", "nan", "0.25"],
    "ints and floats": ["1", "2.5", "16777217"],
    "beyond float32": ["1.5", "3.5e39", "-1e40", "2"],
    "spaces": [" 1.5", "2 ", "3"],
    "words": ["alpha", "beta", "1.5"],
    "hex": ["daa66d2c", "1e5", "ff"],
    "missing": ["1.5", None, "2.5"],
    "empty": [],
}


@pytest.mark.parametrize("name", sorted(_COLUMNS))
@pytest.mark.parametrize("dtype", ["int64", "float32", "bytes"])
def test_typing_with_the_counts_casts_is_typing_without_them(name, dtype):
    col = pa.array([None if v is None else v.encode() for v in _COLUMNS[name]], pa.binary())
    casts: dict = {}
    column_types.count_types(pa.RecordBatch.from_arrays([col], names=["c"]), casts=casts)
    if name in ("words", "hex", "missing", "empty"):
        assert "c" not in casts  # not numbers, or not every cell: typing parses what it needs
    elif name != "spaces":
        assert "c" in casts
    with_casts, bad = column_types.convert_text_column(col, dtype, casts=casts.get("c"))
    without, bad_without = column_types.convert_text_column(col, dtype)
    assert _same(with_casts, without)
    assert np.array_equal(bad, bad_without)


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal type, missing cells and value bytes (NaN equals NaN, as the encoder writes it)."""
    if a.type != b.type or not a.is_null().equals(b.is_null()):
        return False
    if pa.types.is_binary(a.type):
        return a.equals(b)
    filled = [x.fill_null(0).to_numpy(zero_copy_only=False).tobytes() for x in (a, b)]
    return filled[0] == filled[1]
