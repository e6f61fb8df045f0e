"""The conversion writing the blocks layout (docs/block_format.md), read back with protobuf."""

from __future__ import annotations

import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline

from beam_jobs import WriteDataset
from beam_jobs.convert import ConversionError
from beam_jobs.encode.tfrecord import iter_frames
from tests.conftest import read_examples, run_convert, write_text


def _blocks(path) -> list:
    out = []
    for frame in iter_frames(open(path, "rb").read(), verify=True):
        ex = tf.train.Example.FromString(bytes(frame[12:-4]))
        out.append({k: list(getattr(f, f.WhichOneof("kind")).value) if f.WhichOneof("kind") else []
                    for k, f in ex.features.feature.items()})  # fmt: skip
    return out


def _key(row) -> str:
    return repr(sorted(row.items()))


def test_csv_in_blocks_holds_the_rows_the_rows_layout_holds_in_the_same_splits(tmp):
    lines = "".join(f"{i},{'' if i % 7 == 0 else i / 4},w{i % 5}\n" for i in range(3000))
    src = write_text(tmp / "in" / "a.csv", "id,x,word\n" + lines)
    args = [
        "--source",
        "csv",
        "--input",
        src,
        "--splits",
        "train=0.8,eval=0.2",
        "--num_shards",
        "3",
        "--csv_split_mb",
        "0.01",
    ]
    run_convert(*args, "--output", tmp / "rows", "--layout", "rows")
    info = run_convert(*args, "--output", tmp / "blocks", "--layout", "blocks", "--block_rows", "64")
    assert info.layout == "blocks" and info.block_rows == 64 and info.options["layout"] == "blocks"
    for split in ("train", "eval"):
        assert sorted(map(_key, read_examples(tmp / "blocks", split))) == sorted(
            map(_key, read_examples(tmp / "rows", split))
        )
    assert sum(s.blocks for s in info.split("train").shards) < info.split("train").records / 32
    rows_bytes = sum(s.bytes for s in ingest_info(tmp / "rows").split("train").shards)
    assert info.split("train").bytes < 0.6 * rows_bytes


def ingest_info(out):
    import ingest

    return ingest.load_info(str(out))


def test_without_shuffle_blocks_keep_source_order(tmp):
    src = write_text(tmp / "in" / "a.csv", "id\n" + "".join(f"{i}\n" for i in range(1000)))
    run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--layout", "blocks", "--block_rows", "100",
                "--no_shuffle", "--num_shards", "1")  # fmt: skip
    assert [r["id"][0] for r in read_examples(tmp / "out")] == list(range(1000))


def test_parquet_lists_and_missing_values_in_blocks(tmp):
    table = pa.table({
        "id": pa.array(range(500), pa.int64()),
        "tags": pa.array([None if i % 11 == 0 else [f"t{j}" for j in range(i % 4)] for i in range(500)]),
        "vec": pa.array([[float(i), -float(i)] for i in range(500)], pa.list_(pa.float32(), 2)),
    })  # fmt: skip
    os.makedirs(tmp / "in")
    pq.write_table(table, tmp / "in" / "a.parquet")
    args = ["--source", "parquet", "--input", tmp / "in" / "a.parquet", "--num_shards", "2"]
    run_convert(*args, "--output", tmp / "rows", "--layout", "rows")
    run_convert(*args, "--output", tmp / "blocks", "--layout", "blocks", "--block_rows", "16")
    assert sorted(map(_key, read_examples(tmp / "blocks"))) == sorted(map(_key, read_examples(tmp / "rows")))


def test_write_dataset_writes_blocks(tmp):
    rows = [{"id": i, "name": f"n{i}"} for i in range(300)]
    with TestPipeline() as p:
        _ = p | beam.Create(rows) | WriteDataset(str(tmp / "out"), layout="blocks", block_rows=50, num_shards=2)
    assert sorted(r["id"][0] for r in read_examples(tmp / "out")) == list(range(300))


def test_images_and_bad_values_are_refused(tmp):
    with pytest.raises(
        ConversionError, match=r"--layout blocks does not apply to --source images: it is written as rows"
    ):
        run_convert("--source", "images", "--input", tmp / "none", "--output", tmp / "o", "--layout", "blocks")
    src = write_text(tmp / "a.csv", "a\n1\n")
    for rows in ("0", "65537", "1000000000"):
        with pytest.raises(ConversionError, match=rf"--block_rows must be in \[1, 65536\] .*got {rows}"):
            run_convert("--source", "csv", "--input", src, "--output", tmp / "o", "--block_rows", rows)
    with pytest.raises(ConversionError, match=r"--block_rows applies to --layout blocks, but .* --layout rows"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "o", "--layout", "rows", "--block_rows", "64")
    with pytest.raises(ConversionError, match=r"--block_rows must be in \[1, 65536\]"):
        WriteDataset(str(tmp / "o"), block_rows=10**9)
    assert not os.path.exists(tmp / "o")


@pytest.mark.slow
def test_make_dataset_reads_a_converted_blocks_dataset_as_it_reads_rows(tmp):
    import ingest

    lines = "".join(f"{i},{'' if i % 7 == 0 else i / 4},w{i % 5},{i % 2}\n" for i in range(2000))
    src = write_text(tmp / "in" / "a.csv", "id,x,word,y\n" + lines)
    args = ["--source", "csv", "--input", src, "--num_shards", "2", "--label", "y", "--no_shuffle"]
    run_convert(*args, "--output", tmp / "rows", "--layout", "rows")
    run_convert(*args, "--output", tmp / "blocks", "--layout", "blocks", "--block_rows", "128")

    def rows(out, **kwargs):
        got = []
        for features, labels in ingest.make_dataset(str(out), batch_size=100, num_epochs=1, **kwargs):
            for i in range(len(labels)):
                got.append(
                    (
                        int(features["id"][i]),
                        float(features["x"][i]),
                        bytes(features["word"][i].numpy()),
                        int(labels[i]),
                    )
                )
        return got

    # Same rows, values and labels; shards interleave in blocks, not records, so compare as sets.
    assert sorted(rows(tmp / "blocks", shuffle=False)) == sorted(rows(tmp / "rows", shuffle=False))
    shuffled = rows(tmp / "blocks", seed=3)
    assert sorted(shuffled) == sorted(rows(tmp / "rows", shuffle=False)) and shuffled != sorted(shuffled)
    assert shuffled == rows(tmp / "blocks", seed=3)


def test_a_dataset_written_with_format_version_1_still_reads(tmp):
    import ingest

    src = write_text(tmp / "in" / "a.csv", "id,y\n" + "".join(f"{i},{i % 2}\n" for i in range(300)))
    run_convert("--source", "csv", "--input", src, "--output", tmp / "ds", "--label", "y", "--layout", "rows")
    meta_path = tmp / "ds" / "dataset_info.json"
    meta = json.load(open(meta_path))
    meta["format_version"] = 1  # what the previous release wrote: no layout, no block_rows
    del meta["layout"]
    meta["options"].pop("layout"), meta["options"].pop("block_rows")
    meta_path.write_text(json.dumps(meta))
    assert ingest.load_info(str(tmp / "ds")).layout == "rows"
    ids = [int(i) for f, _ in ingest.make_dataset(str(tmp / "ds"), batch_size=64, num_epochs=1) for i in f["id"]]
    assert sorted(ids) == list(range(300))
    meta["format_version"] = 6
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(
        ValueError, match=r"format_version 6; this version of ingest reads format_version 1, 2, 3, 4 and 5"
    ):
        ingest.load_info(str(tmp / "ds"))


def test_blocks_split_by_key_land_in_the_splits_the_rows_layout_gives(tmp):
    src = write_text(tmp / "in" / "a.csv", "user,v\n" + "".join(f"u{i % 50},{i}\n" for i in range(2000)))
    args = ["--source", "csv", "--input", src, "--splits", "train=0.5,eval=0.5", "--split_key", "user"]
    run_convert(*args, "--output", tmp / "rows", "--layout", "rows")
    run_convert(*args, "--output", tmp / "blocks", "--layout", "blocks", "--block_rows", "32")
    for split in ("train", "eval"):
        assert sorted(map(_key, read_examples(tmp / "blocks", split))) == sorted(
            map(_key, read_examples(tmp / "rows", split))
        )
