"""Block index files: the conversion records each blocks shard's block offsets beside it,
and the runtime opens a dataset by reading only the indexes of the shards it reads.

The reference for every offset is the frame-header scan (what datasets converted
before indexes are opened with) or the frames themselves (`iter_frames`); a dataset
"converted before" is a converted one with its indexes taken out of the metadata.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ingest
from beam_jobs.encode.tfrecord import iter_frames
from beam_jobs.output.commit_blocks import write_block_shard
from ingest import contract
from ingest.pipeline.blocks import index as block_index
from tests.conftest import convert_table, run_convert, write_text

K = 16


def _table(n: int, *, ragged: bool = False, missing: bool = False) -> pa.Table:
    columns = {"id": np.arange(n), "x": np.arange(n, dtype=np.float32) / 4}
    if missing:
        columns["x"] = pa.array([None if i % 7 == 0 else i / 4 for i in range(n)], pa.float32())
        columns["word"] = pa.array([None if i % 5 == 0 else f"w{i % 13}" for i in range(n)])
    if ragged:
        columns["tags"] = pa.array([None if i % 11 == 0 else [f"t{j}" for j in range(i % 4)] for i in range(n)])
    return pa.table(columns)


def _convert(root, table, *args, block_rows: int = K) -> str:
    return convert_table(root, table, "--block_rows", str(block_rows), *args)


def _metadata(path) -> dict:
    return json.loads(open(os.path.join(path, contract.METADATA_FILENAME)).read())


def _unindexed(path, to) -> str:
    """A copy of the dataset at `path` as a conversion before block indexes wrote it."""
    shutil.copytree(path, to)
    meta = _metadata(to)
    for split in meta["splits"]:
        for shard in split["shards"]:
            os.remove(os.path.join(to, shard.pop("index")))
    open(os.path.join(to, contract.METADATA_FILENAME), "w").write(json.dumps(meta))
    return str(to)


def _frame_lengths(path) -> list:
    return [len(frame) for frame in iter_frames(open(path, "rb").read())]


def _split(path, name="train"):
    info = ingest.load_info(path)
    return info, info.split(name)


def _arrays(index: block_index.BlockIndex) -> dict:
    return {f.name: getattr(index, f.name) for f in dataclasses.fields(index)}


def _assert_same(a: block_index.BlockIndex, b: block_index.BlockIndex) -> None:
    assert a.files == b.files and a.content == b.content
    for name, value in _arrays(a).items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, _arrays(b)[name], err_msg=name)
    assert a.fingerprint() == b.fingerprint()


@pytest.fixture
def fresh_cache(monkeypatch):
    """Offsets are cached per process by shard: each test opens its datasets anew."""
    monkeypatch.setattr(block_index, "_offsets_cache", {})


@pytest.fixture
def opened(monkeypatch):
    """The files the runtime opens for reading: TensorFlow's GFile is the one way it reads a
    shard or an index (the seam: counting at the file system would also count the parse)."""
    names = []
    gfile = tf.io.gfile.GFile

    def spy(name, mode="r"):
        names.append(os.path.basename(str(name)))
        return gfile(name, mode)

    monkeypatch.setattr(tf.io.gfile, "GFile", spy)
    return names


def _ids(ds) -> list:
    return [i for batch in ds for i in batch["id"].numpy().tolist()]


# --- conversion ----------------------------------------------------------------------


def test_each_uncompressed_blocks_shard_gets_an_index_named_in_the_metadata_holding_its_frame_lengths(tmp_path):
    path = _convert(tmp_path / "ds", _table(1000, missing=True), "--num_shards", "3", "--splits", "train=0.8,eval=0.2")
    for split in _metadata(path)["splits"]:
        for shard in split["shards"]:
            assert shard["index"] == shard["filename"] + ".index"
            data = open(os.path.join(path, shard["index"]), "rb").read()
            assert data[:8] == b"IGBLKIDX"
            lengths = contract.decode_block_index(data, blocks=shard["blocks"], shard_bytes=shard["bytes"])
            assert lengths.tolist() == _frame_lengths(os.path.join(path, shard["filename"]))
    # The rows layout has no blocks; a gzip shard's byte offsets are not its blocks'.
    for args in (["--layout", "rows"], ["--block_rows", str(K), "--compression", "gzip"]):
        other = convert_table(tmp_path / args[1], _table(300), "--num_shards", "2", *args)
        assert all("index" not in s for s in _metadata(other)["splits"][0]["shards"])
        assert not [n for n in os.listdir(other) if n.endswith(".index")]


def test_an_overwrite_replaces_the_indexes_with_their_shards(tmp_path):
    src = write_text(tmp_path / "in" / "a.csv", "a\n" + "".join(f"{i}\n" for i in range(200)))
    out = tmp_path / "out"
    run_convert("--source", "csv", "--input", src, "--output", out, "--num_shards", "3", "--block_rows", "8")
    info = run_convert("--source", "csv", "--input", src, "--output", out, "--num_shards", "1", "--overwrite")
    (shard,) = info.split("train").shards
    # The old dataset's three indexes went with its shards; the new index came with its shard.
    assert sorted(os.listdir(out)) == sorted([contract.METADATA_FILENAME, shard.filename, shard.index])


def test_an_overwrite_deletes_no_file_that_edited_metadata_calls_an_index(tmp_path):
    src = write_text(tmp_path / "in" / "a.csv", "a\n1\n2\n")
    out = tmp_path / "out"
    run_convert("--source", "csv", "--input", src, "--output", out)
    victim = write_text(out / "notes.txt", "the user's own notes")
    meta = _metadata(out)
    meta["splits"][0]["shards"][0]["index"] = "notes.txt"
    open(out / contract.METADATA_FILENAME, "w").write(json.dumps(meta))
    with pytest.raises(Exception, match=r"names 'notes\.txt' as a file of the dataset .* nothing was deleted"):
        run_convert("--source", "csv", "--input", src, "--output", out, "--overwrite")
    assert open(victim).read() == "the user's own notes"


def test_an_empty_shard_has_an_index_of_no_blocks(tmp_path, fresh_cache):
    out = tmp_path / "empty.tfrecord"
    with open(out, "wb") as f:
        lengths = write_block_shard([], f, rng=np.random.default_rng(0), block_rows=K)
    assert len(lengths) == 0 and os.path.getsize(out) == 0
    data = contract.encode_block_index(lengths)
    assert contract.decode_block_index(data, blocks=0, shard_bytes=0).tolist() == []
    # And a dataset listing one is opened with it, as its scan would.
    path = _convert(tmp_path / "ds", _table(100), "--num_shards", "1")
    meta = _metadata(path)
    open(os.path.join(path, "train-00001-of-00002.tfrecord"), "wb").close()
    open(os.path.join(path, "train-00001-of-00002.tfrecord.index"), "wb").write(data)
    empty = {"filename": "train-00001-of-00002.tfrecord", "records": 0, "bytes": 0, "blocks": 0}
    meta["splits"][0]["shards"].append({**empty, "index": empty["filename"] + ".index"})
    open(os.path.join(path, contract.METADATA_FILENAME), "w").write(json.dumps(meta))
    info, split = _split(path)
    indexed = block_index.index_split(path, split, K, content="c")
    block_index._offsets_cache.clear()
    scanned = block_index.index_split(path, _without_indexes(split), K, content="c")
    _assert_same(indexed, scanned)
    assert sorted(_ids(ingest.make_dataset(path, batch_size=32, seed=1))) == list(range(100))


def _without_indexes(split: contract.SplitInfo) -> contract.SplitInfo:
    return dataclasses.replace(split, shards=tuple(dataclasses.replace(s, index=None) for s in split.shards))


# --- offsets: the same BlockIndex as the scan ------------------------------------------


@pytest.mark.parametrize(
    "n, kwargs, block_rows, args",
    [
        (1000, dict(ragged=True, missing=True), K, ["--num_shards", "3"]),  # ragged lists, missing values
        (1001, {}, K, ["--num_shards", "4"]),  # short last blocks
        (300, dict(missing=True), 1, ["--num_shards", "2"]),  # a block per row
        (1000, dict(ragged=True), K, ["--num_shards", "1", "--no_shuffle"]),
    ],
    ids=["ragged_missing", "short_last_block", "one_row_blocks", "one_shard_unshuffled"],
)
def test_offsets_read_from_the_indexes_are_the_scans(tmp_path, fresh_cache, n, kwargs, block_rows, args):
    path = _convert(tmp_path / "new", _table(n, **kwargs), *args, block_rows=block_rows)
    old = _unindexed(path, tmp_path / "old")
    info, split = _split(path)
    assert info.block_rows == block_rows and (block_rows == 1 or any(s.records % K for s in split.shards))
    content = str(info.source["job"])
    indexed = block_index.index_split(path, split, info.block_rows, content=content)
    _, old_split = _split(old)
    assert all(s.index is not None for s in split.shards) and all(s.index is None for s in old_split.shards)
    scanned = block_index.index_split(old, old_split, info.block_rows, content=content)
    assert len(indexed) == sum(s.blocks for s in split.shards)
    _assert_same(indexed, dataclasses.replace(scanned, files=tuple(f.replace(old, path) for f in scanned.files)))
    assert indexed.fingerprint() == scanned.fingerprint()  # names, not directories, are hashed


def test_a_checkpoint_of_a_scanned_dataset_restores_into_the_indexed_one(tmp_path, fresh_cache):
    path = _convert(tmp_path / "new", _table(2000, ragged=True), "--num_shards", "3")
    old = _unindexed(path, tmp_path / "old")
    it = iter(ingest.make_dataset(old, batch_size=64, seed=5))
    next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt" / "c"))
    expected = [b["id"].numpy().tolist() for b in (next(it) for _ in range(3))]
    restored = iter(ingest.make_dataset(path, batch_size=64, seed=5))
    tf.train.Checkpoint(iterator=restored).read(prefix)
    assert [next(restored)["id"].numpy().tolist() for _ in range(3)] == expected


# --- what an input pipeline opens ------------------------------------------------------


@pytest.fixture(scope="module")
def eight_shards(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("eight"), _table(2000, missing=True), "--num_shards", "8")


@pytest.mark.parametrize("pipelines, pipeline_id, shards", [(4, 1, [1, 5]), (3, 2, [2, 5]), (1, 0, range(8))])
def test_a_pipeline_opens_only_the_indexes_of_its_own_shards(
    eight_shards, fresh_cache, opened, pipelines, pipeline_id, shards
):
    ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id)
    ingest.make_dataset(eight_shards, batch_size=32, seed=1, input_context=ctx)
    assert sorted(n for n in opened if n.endswith(".index")) == [
        f"train-{i:05d}-of-00008.tfrecord.index" for i in shards
    ]
    # No shard read to build it, but the two 4 KiB ends its fingerprint check reads (by
    # os.pread, not GFile; counted by the 100k-block test's byte meter).
    assert not [n for n in opened if n.endswith(".tfrecord")]


def test_with_fewer_shards_than_pipelines_every_index_is_read_and_blocks_are_dealt(eight_shards, fresh_cache, opened):
    info, split = _split(eight_shards)
    full = block_index.index_split(eight_shards, _without_indexes(split), K, content="c")
    block_index._offsets_cache.clear()
    for pipeline_id in range(16):
        mine = block_index.pipeline_index(
            eight_shards, split, K, content="c", num_pipelines=16, pipeline_id=pipeline_id
        )
        _assert_same(mine, block_index.pipeline_blocks(full, num_pipelines=16, pipeline_id=pipeline_id))
    assert sorted(n for n in opened if n.endswith(".index")) == [
        f"train-{i:05d}-of-00008.tfrecord.index" for i in range(8)
    ]


@pytest.mark.parametrize("pipelines", [2, 3, 8])
def test_a_pipelines_index_is_its_share_of_the_scanned_split(eight_shards, fresh_cache, pipelines):
    info, split = _split(eight_shards)
    scanned = block_index.index_split(eight_shards, _without_indexes(split), K, content="c")
    block_index._offsets_cache.clear()
    for pipeline_id in range(pipelines):
        mine = block_index.pipeline_index(
            eight_shards, split, K, content="c", num_pipelines=pipelines, pipeline_id=pipeline_id
        )
        _assert_same(mine, block_index.pipeline_blocks(scanned, num_pipelines=pipelines, pipeline_id=pipeline_id))


def test_a_dataset_converted_before_indexes_is_scanned(tmp_path, fresh_cache, opened):
    path = _convert(tmp_path / "new", _table(1000, missing=True), "--num_shards", "3")
    old = _unindexed(path, tmp_path / "old")
    assert sorted(_ids(ingest.make_dataset(old, batch_size=64, seed=1))) == list(range(1000))
    assert sorted({n for n in opened if n.endswith(".tfrecord")}) == [
        f"train-{i:05d}-of-00003.tfrecord" for i in range(3)
    ]
    assert not [n for n in opened if n.endswith(".index")]


# --- damaged indexes -------------------------------------------------------------------


def _cut(data):
    return data[:-8]


def _appended(data):
    return data + b"\0" * 8


def _flipped(data):
    return data[:30] + bytes([data[30] ^ 0x40]) + data[31:]


def _garbage(data):
    return b"not an index" * 4


def _empty(data):
    return b""


@pytest.mark.parametrize(
    "damage, message",
    [
        (_cut, r"it holds \d+ bytes where its \d+ blocks take \d+: it was cut short or appended to"),
        (_appended, r"it holds \d+ bytes where its \d+ blocks take \d+: it was cut short or appended to"),
        (_flipped, r"its CRC-32 does not match its contents: it is corrupt"),
        (_garbage, r"it does not start with b'IGBLKIDX' \(found b'not an i'\): it is not a block index"),
        (_empty, r"it holds 0 bytes, less than its 24-byte header"),
        ("other_shard", r"it lists \d+ blocks, the metadata \d+|its blocks' frames add up to \d+ bytes, the metadata"),
    ],
    ids=["cut", "appended", "flipped", "garbage", "empty", "other_shard"],
)
def test_a_damaged_index_is_an_error_naming_it_and_the_fix(tmp_path, fresh_cache, damage, message):
    path = _convert(tmp_path, _table(1500, missing=True), "--num_shards", "3", block_rows=10)
    _, split = _split(path)
    target = os.path.join(path, split.shards[1].index)
    if damage == "other_shard":
        (other,) = [
            s for s in split.shards[::2] if (s.blocks, s.bytes) != (split.shards[1].blocks, split.shards[1].bytes)
        ][:1]
        shutil.copyfile(os.path.join(path, other.index), target)
    else:
        data = open(target, "rb").read()
        open(target, "wb").write(damage(data))
    expected = rf"block index {re.escape(target)} of shard .*train-00001-of-00003\.tfrecord does not describe that "
    with pytest.raises(ValueError, match=expected + rf"shard: (?:{message})\. .*reconvert the dataset"):
        ingest.make_dataset(path, batch_size=64)


def test_a_missing_index_is_an_error_naming_it_and_the_fix(tmp_path, fresh_cache):
    path = _convert(tmp_path, _table(500), "--num_shards", "2")
    _, split = _split(path)
    os.remove(os.path.join(path, split.shards[0].index))
    message = (
        r"block index .*train-00000-of-00002\.tfrecord\.index of shard .* is missing \(dataset_info\.json names "
        r"it\): copy it along with its shard .* or reconvert the dataset"
    )
    with pytest.raises(ValueError, match=message):
        ingest.make_dataset(path, batch_size=64)


def test_metadata_listing_other_blocks_than_the_index_is_an_error(tmp_path, fresh_cache):
    path = _convert(tmp_path, _table(500), "--num_shards", "1")
    meta = _metadata(path)
    shard = meta["splits"][0]["shards"][0]
    # A block of rows fewer, so that the metadata still agrees with itself: only the index tells.
    shard["blocks"] -= 1
    shard["records"] -= K
    meta["splits"][0]["records"] -= K
    open(os.path.join(path, contract.METADATA_FILENAME), "w").write(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"it lists {shard['blocks'] + 1} blocks, the metadata {shard['blocks']}"):
        ingest.make_dataset(path, batch_size=64)


@pytest.mark.parametrize("change", ["cut", "appended"])
def test_a_shard_whose_size_is_not_the_metadatas_is_an_error_naming_it_without_reading_it(
    tmp_path, fresh_cache, opened, change
):
    path = _convert(tmp_path, _table(500), "--num_shards", "2")
    _, split = _split(path)
    shard = os.path.join(path, split.shards[1].filename)
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[:-100] if change == "cut" else data + data[:100])
    size = len(data) - 100 if change == "cut" else len(data) + 100
    what = "is shorter than" if change == "cut" else "holds more blocks than"
    message = (
        rf"shard {re.escape(shard)} {what} its metadata says: its {split.shards[1].blocks} blocks end at byte "
        rf"{len(data)}, the file has {size}\. .* Reconvert the dataset"
    )
    with pytest.raises(ValueError, match=message):
        ingest.make_dataset(path, batch_size=64)
    assert not [n for n in opened if n.endswith(".tfrecord")]  # its size, not a scan of its frames


# --- the format and the metadata (pure) ------------------------------------------------


def test_the_index_format_round_trips_and_refuses_what_it_cannot_trust():
    lengths = [16, 100, 37]
    data = contract.encode_block_index(lengths)
    assert len(data) == 24 + 8 * 3 and data[:12] == b"IGBLKIDX\x01\x00\x00\x00"
    assert contract.decode_block_index(data, blocks=3, shard_bytes=153).tolist() == lengths
    with pytest.raises(ValueError, match=r"it lists 3 blocks, the metadata 4"):
        contract.decode_block_index(data, blocks=4, shard_bytes=153)
    with pytest.raises(ValueError, match=r"its blocks' frames add up to 153 bytes, the metadata lists 154"):
        contract.decode_block_index(data, blocks=3, shard_bytes=154)
    newer = data[:8] + (2).to_bytes(4, "little") + data[12:]
    with pytest.raises(ValueError, match=r"it has version 2; this version of ingest reads version 1"):
        contract.decode_block_index(newer, blocks=3, shard_bytes=153)
    with pytest.raises(ValueError, match=r"frame lengths must be a list of integers >= 16"):
        contract.encode_block_index([16, 15])


@pytest.mark.parametrize(
    "index, message",
    [
        ("../train-00000-of-00001.tfrecord.index", r"\.index must name a file inside the dataset directory"),
        ("/abs/x.index", r"\.index must name a file inside the dataset directory"),
        ("gs://b/x.index", r"\.index must name a file inside the dataset directory"),
        ("train-00000-of-00001.tfrecord", r"\.index names the shard itself"),
        (3, r"\.index must be a string or null, got an integer 3"),
    ],
)
def test_metadata_naming_an_index_outside_the_dataset_is_refused(index, message):
    shard = {"filename": "train-00000-of-00001.tfrecord", "records": 3, "bytes": 40, "blocks": 1, "index": index}
    with pytest.raises(ValueError, match=message):
        contract.ShardInfo.from_json(shard)


@pytest.mark.parametrize("layout, compression", [("rows", "none"), ("blocks", "gzip")])
def test_an_index_is_refused_where_blocks_have_no_offsets(layout, compression):
    shard = contract.ShardInfo("train-00000-of-00001.tfrecord", 3, 40, 1, "train-00000-of-00001.tfrecord.index")
    with pytest.raises(ValueError, match=r"has a block index, which only uncompressed shards of the blocks layout"):
        contract.DatasetInfo(
            features=(contract.FeatureSpec("id", "int64"),),
            splits=(contract.SplitInfo("train", (shard,)),),
            compression=compression,
            layout=layout,
            block_rows=K if layout == "blocks" else None,
        )


# --- at scale --------------------------------------------------------------------------


def _read_bytes() -> int:
    """Bytes this process has read through read(2) and pread(2), page cache included."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.slow
def test_opening_a_dataset_of_100k_blocks_reads_under_5_percent_of_it(tmp_path, fresh_cache):
    n, rows_per_block = 400_000, 4
    words = np.array([f"{i:04d}-{i * 7919 % 10007:05d}-seattle-weather" for i in range(1000)], object)
    table = pa.table({"id": np.arange(n), "x": np.arange(n, dtype=np.float32), "word": words[np.arange(n) % 1000]})
    path = convert_table(tmp_path / "new", table, "--num_shards", "16", "--block_rows", str(rows_per_block))
    old = _unindexed(path, tmp_path / "old")
    _, split = _split(path)
    assert sum(s.blocks for s in split.shards) >= 100_000
    warm = convert_table(tmp_path / "warm", _table(100), "--block_rows", "4")
    ingest.make_dataset(warm, batch_size=32)  # the modules and graph functions a first build loads
    read = {}
    for name, where in (("indexed", path), ("scanned", old)):
        before = _read_bytes()
        ingest.make_dataset(where, batch_size=256)
        read[name] = _read_bytes() - before
    # The meter sees the scan read every shard; the indexes are 8 bytes a block (~210 here).
    assert read["scanned"] > 0.9 * split.bytes
    assert read["indexed"] < 0.05 * split.bytes, read
