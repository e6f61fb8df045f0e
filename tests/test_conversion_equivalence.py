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
import pytest

from beam_jobs import _parsed_chunks
from beam_jobs.sources import readers
from tests.conftest import run_convert


def _corpus_rows(rng, n: int, first: int) -> list:
    words = ["alpha", "beta", "gamma", "δέλτα", "", "NA", "東京", "e,f"]
    lines = []
    for i in range(first, first + n):
        word = words[rng.integers(len(words))]
        url = f"https://ex.example/{rng.integers(1 << 40):x}/ü{i}"  # every value distinct
        num = "" if i % 17 == 0 else f"{rng.normal():.5f}"
        count = "NA" if i % 23 == 0 else str(int(rng.integers(-5, 1 << 20)))
        label = str(i % 3)
        lines.append(f'{num},{count},"{word}",{url},{label}')
    return lines


def write_corpus(folder, *, rows: int, seed: int, bad: bool = True) -> str:
    """Two CSV files of `rows` rows each (a header each), a few bad rows among them."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for f in range(2):
        lines = _corpus_rows(rng, rows, f * rows)
        if bad:
            lines[rows // 3] = "1.0,2,too,many,fields,here"  # field count
            lines[rows // 2] = "x.5,7,word,https://ex.example/t,1"  # not a number: type
            lines[rows // 5] = "0.5,7,word,https://ex.example/bad,1"  # invalid UTF-8, below
            lines[rows // 4] = '0.5,3,"open quote,https://ex.example/q,2'  # unterminated quote
        data = ("num,count,word,url,label\n" + "\n".join(lines) + "\n").encode("utf-8")
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
    assert sorted(kinds) == sorted(["field_count", "type", "unterminated_quote", "utf8"] * 2)


def test_chunks_over_the_budget_are_read_again_and_another_jobs_are_never_taken():
    store = _parsed_chunks.ParsedChunks(budget_bytes=100)

    class Chunk:
        def __init__(self, nbytes):
            self.batch = type("Batch", (), {"nbytes": nbytes})()

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
