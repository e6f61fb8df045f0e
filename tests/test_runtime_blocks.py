"""make_dataset on the blocks layout against the same rows written in the rows layout.

The datasets are written here with the two encoders (no conversion job): the same rows,
once one Example per row, once in blocks of K rows with a short last block per shard, in
several shards and two splits, with the metadata the conversion would write.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ingest
from beam_jobs.encode.blocks import encode_blocks
from beam_jobs.encode.examples import encode_batch
from benchmarks import mixing
from ingest import contract
from ingest.pipeline._dataset import read_records
from ingest.pipeline.blocks import seekable as seekable_order
from ingest.pipeline.blocks import streaming as block_stream

K = 32
_SPLITS = {"train": (0, 4000, 4), "eval": (4000, 4300, 2)}  # name: (first id, end id, shards)
_DEFAULTS = {"i": -1, "s": "none"}


def _columns(ids: np.ndarray):
    """[(name, dtype, arrow array)] for rows `ids`: every dtype and shape, missing values, a label."""
    n = len(ids)
    i = pa.array([None if k % 7 == 0 else int(k) * 3 for k in ids], pa.int64())
    f = pa.array([None if k % 5 == 0 else k / 8 for k in ids], pa.float32())
    s = pa.array([None if k % 11 == 0 else f"s{k}".encode() for k in ids], pa.large_binary())
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32).ravel()), 3
    )
    tags = pa.array(
        [None if k % 13 == 0 else [f"t{j}".encode() for j in range(k % 4)] for k in ids],
        pa.large_list(pa.large_binary()),
    )
    ints = pa.array([[int(k) + j for j in range(k % 5)] for k in ids], pa.large_list(pa.int64()))
    y = pa.array((ids % 3).astype(np.int64))
    cols = [
        ("id", "int64", pa.array(ids.astype(np.int64))),
        ("i", "int64", i),
        ("f", "float32", f),
        ("s", "bytes", s),
        ("vec", "float32", vec),
        ("tags", "bytes", tags),
        ("ints", "int64", ints),
        ("y", "int64", y),
    ]
    assert all(len(a) == n for _, _, a in cols)
    return cols


def _features() -> tuple:
    # The missing counts over both splits; the rows layout needs them to fill defaults.
    ids = np.arange(4300)
    return (
        contract.FeatureSpec("id", "int64"),
        contract.FeatureSpec("i", "int64", missing=int((ids % 7 == 0).sum()), default=-1),
        contract.FeatureSpec("f", "float32", missing=int((ids % 5 == 0).sum())),
        contract.FeatureSpec("s", "bytes", missing=int((ids % 11 == 0).sum()), default="none"),
        contract.FeatureSpec("vec", "float32", shape=(3,)),
        contract.FeatureSpec("tags", "bytes", shape=(None,), missing=int((ids % 13 == 0).sum()), max_length=3),
        contract.FeatureSpec("ints", "int64", shape=(None,), max_length=4),
        contract.FeatureSpec("y", "int64", role="label"),
    )


def _write(path: str, frames: bytes) -> int:
    with open(path, "wb") as f:
        f.write(frames)
    return len(frames)


def _build(root, layout: str, splits=_SPLITS) -> str:
    os.makedirs(root, exist_ok=True)
    split_infos = []
    for name, (first, end, num_shards) in splits.items():
        shards = []
        for index, ids in enumerate(np.array_split(np.arange(first, end), num_shards)):
            filename = contract.shard_filename(name, index, num_shards)
            cols = _columns(ids)
            if layout == "rows":
                buf, _, _ = encode_batch(cols, len(ids), framed=True)
                blocks = None
            else:
                buf, _, _, sizes = encode_blocks(cols, len(ids), K, _DEFAULTS)
                blocks = len(sizes)
                assert sizes[-1] < K  # a short last block in every shard
            size = _write(os.path.join(root, filename), buf.tobytes())
            shards.append(contract.ShardInfo(filename, len(ids), size, blocks))
        split_infos.append(contract.SplitInfo(name, tuple(shards)))
    info = contract.DatasetInfo(
        features=_features(),
        splits=tuple(split_infos),
        label="y",
        layout=layout,
        block_rows=K if layout == "blocks" else None,
    )
    with open(os.path.join(root, contract.METADATA_FILENAME), "w") as f:
        f.write(info.to_json())
    return str(root)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return _build(root / "rows", "rows"), _build(root / "blocks", "blocks")


def _batches(ds) -> list:
    return [tf.nest.map_structure(_numpy, b) for b in ds]


def _numpy(t):
    return t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy().tolist()


def _ids(ds) -> list:
    out = []
    for b in ds:
        features = b[0] if isinstance(b, tuple) else b
        out.extend(features["id"].numpy().tolist())
    return out


# File order: one shard at a time (cycle_length=1), so that both layouts deliver rows in
# the same order whatever the interleave's granularity (records vs blocks).
_IN_ORDER = dict(shuffle=False, deterministic=True, options=ingest.ReadOptions(cycle_length=1))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=64),
        dict(batch_size=100, split="eval"),
        dict(batch_size=50, label=False),
        dict(batch_size=64, features=["s", "tags"]),
        dict(batch_size=64, pad_lengths={"tags": 2, "ints": 6}),
        dict(batch_size=32, drop_remainder=True, static_shapes=True),
        dict(batch_size=1000, num_epochs=2, drop_remainder=True),
        dict(batch_size=300, num_epochs=3),
    ],
)
def test_unshuffled_blocks_give_the_same_batches_as_rows(both, kwargs):
    rows, blocks = (ingest.make_dataset(p, **_IN_ORDER, **kwargs) for p in both)
    assert rows.element_spec == blocks.element_spec
    assert int(rows.cardinality()) == int(blocks.cardinality()) > 0
    expected = _batches(rows)
    assert [_as_rows_mask(b) for b in _batches(blocks)] == expected
    assert len(expected) == int(rows.cardinality())


def _as_rows_mask(batch):
    """The rows layout's mask of a variable-length feature is True at empty lists too (a
    record cannot tell a missing list from an empty one): the blocks' mask, made so."""
    x = batch[0] if isinstance(batch, tuple) else batch
    if "tags_missing" in x:  # ragged or padded: an empty list is all padding (no tag is "")
        x = dict(x, tags_missing=[m or not any(t) for m, t in zip(x["tags_missing"], x["tags"])])
    return (x,) + tuple(batch[1:]) if isinstance(batch, tuple) else x


@pytest.mark.parametrize("layout", [0, 1], ids=["rows", "blocks"])
def test_missing_values_come_back_as_the_recorded_defaults_with_a_mask(both, layout):
    (batch,) = ingest.make_dataset(both[layout], batch_size=4000, **_IN_ORDER).take(1)
    x, y = batch
    ids = x["id"].numpy()
    assert ids.tolist() == list(range(4000)) and y.numpy().tolist() == (ids % 3).tolist()
    assert (x["i"].numpy()[ids % 7 == 0] == -1).all() and (x["s"].numpy()[ids % 11 == 0] == b"none").all()
    assert (x["f"].numpy()[ids % 5 == 0] == 0).all()
    assert all(len(t) == 0 for t, k in zip(x["tags"].to_list(), ids) if k % 13 == 0)
    assert x["vec"].shape == (4000, 3) and x["vec"][5].numpy().tolist() == [5, 5.5, -5]
    # Each feature the metadata counts missing values for has its mask; the others none.
    assert sorted(k for k in x if k.endswith("_missing")) == ["f_missing", "i_missing", "s_missing", "tags_missing"]
    for name, every in (("i", 7), ("f", 5), ("s", 11)):
        assert x[name + "_missing"].dtype == tf.bool
        assert x[name + "_missing"].numpy().tolist() == (ids % every == 0).tolist()
    tags = ids % 13 == 0
    if layout == 0:  # the rows layout: an empty list is masked too
        tags |= ids % 4 == 0
    assert x["tags_missing"].numpy().tolist() == tags.tolist()
    (filled, _), *_ = ingest.make_dataset(both[layout], batch_size=4000, missing="fill", **_IN_ORDER).take(1)
    assert sorted(filled) == sorted(k for k in x if not k.endswith("_missing"))
    assert filled["i"].numpy().tolist() == x["i"].numpy().tolist()


def test_default_shuffle_reads_every_row_once_in_another_order(both):
    epochs = [_ids(ingest.make_dataset(p, batch_size=64, seed=5)) for p in both]
    for ids in epochs:
        assert sorted(ids) == list(range(4000)) and ids != list(range(4000))


@pytest.mark.slow
def test_a_seed_makes_block_runs_identical_and_another_seed_differs(both):
    def run(seed, **kwargs):
        return _batches(ingest.make_dataset(both[1], batch_size=64, seed=seed, num_epochs=2, **kwargs))

    first = run(7)
    assert run(7) == first
    ids = [r for x, _ in first for r in x["id"]]
    assert ids[:4000] != ids[4000:] and sorted(ids[:4000]) == sorted(ids[4000:]) == list(range(4000))
    assert [r for x, _ in run(8) for r in x["id"]] != ids
    small_windows = ingest.ReadOptions(block_window=4, block_shuffle_buffer=8)
    assert run(7, options=small_windows) == run(7, options=small_windows)


@pytest.mark.slow
def test_each_pass_over_a_seeded_dataset_permutes_anew_and_reproducibly(both):
    # Keras' fit iterates a finite dataset anew each epoch: with a seed, the passes must
    # differ from each other (as tf.data's reshuffle_each_iteration does) yet repeat per seed.
    def passes(seed):
        ds = ingest.make_dataset(both[1], batch_size=64, seed=seed)
        return [_ids(ds) for _ in range(3)]

    first = passes(9)
    assert first[0] != first[1] != first[2] and sorted(first[1]) == list(range(4000))
    assert passes(9) == first


def test_block_order_changes_with_every_pass_and_epoch(both):
    # One block per window: the order rows come in is the order blocks are read in. Block
    # neighbours of one epoch must rarely be neighbours in another (a random order keeps
    # ~2 of the 127 pairs; a seed word that a permutation op ignores would keep all).
    def block_order(ids):
        blocks = [(i // 1000, i % 1000 // K) for i in ids]
        return list(dict.fromkeys(blocks))

    def kept_neighbours(a, b):
        pairs = set(zip(b, b[1:]))
        return sum(p in pairs for p in zip(a, a[1:])) / (len(a) - 1)

    options = ingest.ReadOptions(block_window=1, block_run=1)
    ds = ingest.make_dataset(both[1], batch_size=K, seed=4, num_epochs=2, options=options)
    first_pass, second_pass = _ids(ds), _ids(ds)
    epochs = [block_order(first_pass[:4000]), block_order(first_pass[4000:]), block_order(second_pass[:4000])]
    assert all(len(order) == 128 for order in epochs)
    assert kept_neighbours(epochs[0], epochs[1]) < 0.2  # epochs of one pass
    assert kept_neighbours(epochs[0], epochs[2]) < 0.2  # passes


def test_seekable_order_reads_runs_of_consecutive_blocks_in_an_order_that_changes(both):
    # Runs of 3 blocks (a shard's 32 blocks: 10 runs of 3, and 2 blocks) are read whole, in
    # a permutation of the 44 runs that changes with every epoch and pass. One-block windows
    # (a shard's short last block makes later windows straddle two blocks) keep a block's
    # rows within ~2 blocks of the stream.
    ds = ingest.make_dataset(
        both[1], batch_size=K, seed=4, num_epochs=2, options=ingest.ReadOptions(block_window=1, block_run=3)
    )
    first_pass, second_pass = _ids(ds), _ids(ds)

    def where(ids):
        """(shard, block) -> mean position of its rows in the epoch."""
        at = {}
        for position, i in enumerate(ids):
            at.setdefault((i // 1000, i % 1000 // K), []).append(position)
        return {block: np.mean(p) for block, p in at.items()}

    def run_order(ids):
        at = where(ids)
        assert len(at) == 128
        for (shard, block), position in at.items():
            if block % 3:  # not the first of its run: read right after the block before it
                assert 0 < position - at[(shard, block - 1)] <= 2 * K, (shard, block)
        return sorted({(shard, block // 3) for shard, block in at}, key=lambda r: at[(r[0], 3 * r[1])])

    def kept_neighbours(a, b):
        pairs = set(zip(b, b[1:]))
        return sum(p in pairs for p in zip(a, a[1:])) / (len(a) - 1)

    epochs = [run_order(first_pass[:4000]), run_order(first_pass[4000:]), run_order(second_pass[:4000])]
    assert all(len(r) == 44 for r in epochs)
    # A run's last block followed by the next run of its shard would be chance (a random
    # order keeps ~1 of the 43 pairs of runs); the order changes with the epoch and the pass.
    assert kept_neighbours(epochs[0], epochs[1]) < 0.2
    assert kept_neighbours(epochs[0], epochs[2]) < 0.2


def test_runs_hold_only_blocks_that_follow_each_other_in_a_file():
    from ingest.pipeline.blocks.index import BlockIndex
    from ingest.pipeline.blocks.seekable import block_runs

    file_of = np.array([0] * 5 + [1] * 2 + [2] * 9)
    offsets = np.concatenate([np.arange(5), np.arange(2), np.arange(9)]) * 10
    index = BlockIndex(("a", "b", "c"), file_of, offsets, np.full(16, 10), np.full(16, K), np.zeros(16, np.int64))
    starts, lengths = block_runs(index, 4)
    assert starts.tolist() == [0, 4, 5, 7, 11, 15] and lengths.tolist() == [4, 1, 2, 4, 4, 1]
    # Blocks dealt round robin to two input pipelines are not neighbours: runs of one.
    starts, lengths = block_runs(index.take(np.arange(0, 16, 2)), 4)
    assert lengths.tolist() == [1] * 8


def test_shuffled_rows_hold_the_same_values_in_both_layouts(both):
    def by_id(path):
        rows = {}
        for x, y in _batches(ingest.make_dataset(path, batch_size=128, seed=3, pad_lengths={"tags": 3})):
            x = _as_rows_mask(x)
            for k, i in enumerate(x["id"]):
                rows[i] = ({name: v[k] for name, v in x.items()}, y[k])
        return rows

    rows, blocks = by_id(both[0]), by_id(both[1])
    assert len(rows) == 4000 and rows == blocks


@pytest.mark.slow
def test_rows_of_a_batch_scatter_in_the_next_epoch(both, monkeypatch):
    batch_size, n = 64, 4000

    def fraction(path):
        ids = np.array(_ids(ingest.make_dataset(path, batch_size=batch_size, seed=11, num_epochs=2)))
        first, second = (mixing.batches_of(e, batch_size) for e in (ids[:n], ids[n:]))
        return mixing.reshare_fraction(first, second)

    ideal = (batch_size - 1) / (n - 1)
    rows, blocks = fraction(both[0]), fraction(both[1])
    assert rows < 5 * ideal and blocks < 5 * ideal
    # The seam: without the in-window permutation block-mates travel together.
    monkeypatch.setattr(seekable_order, "_within_epochs", lambda n, *_: tf.range(n))
    unpermuted = fraction(both[1])
    assert unpermuted > 0.3 and blocks < unpermuted / 5
    # The same seam in the streaming order.
    monkeypatch.setattr(block_stream, "permute_rows", lambda rows, seed: rows)
    streaming = ingest.ReadOptions(seekable_order=False)
    ids = np.array(_ids(ingest.make_dataset(both[1], batch_size=batch_size, seed=11, num_epochs=2, options=streaming)))
    first, second = (mixing.batches_of(e, batch_size) for e in (ids[:n], ids[n:]))
    assert mixing.reshare_fraction(first, second) > 0.3


def _block_dict(serialized: bytes) -> dict:
    ex = tf.train.Example.FromString(serialized)
    return {k: list(getattr(f, f.WhichOneof("kind")).value) for k, f in ex.features.feature.items()}


def _shard_path(root, index=1):
    info = ingest.load_info(root)
    return os.path.join(root, info.split("train").shards[index].filename)


def _frames(path) -> list:
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


def _rewrite(path, records):
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


@pytest.fixture
def blocks_copy(tmp_path):
    return _build(tmp_path / "blocks", "blocks", {"train": (0, 1000, 3)})


@pytest.mark.parametrize("change", ["one_too_many", "one_too_few"])
def test_a_shard_with_a_block_too_many_or_too_few_is_an_error_naming_it(blocks_copy, change):
    path = _shard_path(blocks_copy)
    frames = _frames(path)
    _rewrite(path, frames + frames[:1] if change == "one_too_many" else frames[:-1])
    # The seekable order finds it while indexing the blocks, before any batch.
    expected = (
        rf"shard {re.escape(path)} holds more blocks than its metadata says"
        if change == "one_too_many"
        else rf"shard {re.escape(path)} ends after {len(frames) - 1} of the {len(frames)} blocks its metadata lists"
    )
    with pytest.raises(ValueError, match=expected):
        ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False)
    # The streaming order, as it reads the shard.
    expected = (
        rf"shard {re.escape(path)} holds more blocks than its metadata says"
        if change == "one_too_many"
        else rf"shard {re.escape(path)} is corrupt, truncated or unreadable: "
        rf"read {len(frames) - 1} of {len(frames)} blocks"
    )
    streaming = ingest.ReadOptions(seekable_order=False)
    with pytest.raises(tf.errors.OpError, match=expected):
        _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, options=streaming))


def test_a_shard_cut_after_the_dataset_was_built_names_the_first_missing_block(blocks_copy):
    path = _shard_path(blocks_copy)
    frames = _frames(path)
    ds = ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False)  # indexed while whole
    _rewrite(path, frames[:2])
    with pytest.raises(tf.errors.OpError, match=rf"shard {re.escape(path)} ends before its block 2 \(byte offset"):
        _ids(ds)


@pytest.mark.parametrize("num_epochs", [1, None])
def test_a_shard_cut_to_before_every_block_of_a_window_names_the_first(blocks_copy, num_epochs):
    # No block of the window can be read: the window still reaches the check (it was left
    # out, the batches falling short silently when endless, else with a count error).
    path = _shard_path(blocks_copy, index=0)  # the first window's blocks are all in it
    options = ingest.ReadOptions(block_window=1)
    ds = ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, num_epochs=num_epochs, options=options)
    _rewrite(path, [])
    with pytest.raises(tf.errors.OpError, match=rf"shard {re.escape(path)} ends before its block 0 \(byte offset 0\)"):
        for _, batch in zip(range(10_000), ds):
            pass


@pytest.mark.slow
def test_blocks_holding_other_row_counts_than_the_metadata_are_named(blocks_copy):
    meta = os.path.join(blocks_copy, contract.METADATA_FILENAME)
    info = json.loads(open(meta).read())
    # The shards hold blocks of K rows; K + 1 makes as many blocks of each shard's rows, so
    # the metadata agrees with itself and only the blocks tell.
    info["block_rows"] = K + 1
    open(meta, "w").write(json.dumps(info))
    message = rf"block 0 of shard .* holds {K} rows, its metadata says {K + 1}"
    for options in (None, ingest.ReadOptions(seekable_order=False)):  # the seekable order, the streaming one
        with pytest.raises(tf.errors.OpError, match=message):
            _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, options=options))
    # Skipping corrupt records does not deliver rows the metadata does not list either.
    with pytest.raises(tf.errors.OpError, match=rf"shard .* block 0 holds {K} rows, but .* lists {K + 1}"):
        _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, skip_corrupt=True))


@pytest.mark.slow
def test_a_malformed_block_is_named_by_its_shard_and_position(blocks_copy):
    path = _shard_path(blocks_copy)
    frames = _frames(path)
    example = tf.train.Example.FromString(frames[1])
    del example.features.feature["id"].int64_list.value[-1]
    _rewrite(path, [frames[0], example.SerializeToString(), *frames[2:]])
    message = rf"block feature `id` holds {K - 1} values for {K} rows \(block 1 of shard {re.escape(path)}\)"
    for options in (None, ingest.ReadOptions(seekable_order=False)):
        with pytest.raises(tf.errors.OpError, match=message):
            _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, options=options))


@pytest.mark.slow
def test_skip_corrupt_on_blocks_counts_the_lost_rows(blocks_copy):
    path = _shard_path(blocks_copy)
    info = ingest.load_info(blocks_copy)
    data = bytearray(open(path, "rb").read())
    frames = _frames(path)
    # Damage the third block's payload: its CRC fails and the rest of the shard is lost.
    third = sum(len(f) + 16 for f in frames[:2])
    data[third + 12 + 5] ^= 0xFF
    open(path, "wb").write(bytes(data))
    # The seekable order cannot name the file (no ignore_errors under symbolic checkpoints):
    # TensorFlow's own error gives the record's byte offset. The streaming order names it.
    with pytest.raises(tf.errors.DataLossError, match=rf"corrupted record at {third + 12}\b"):
        _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False))
    streaming = ingest.ReadOptions(seekable_order=False)
    with pytest.raises(tf.errors.OpError, match=rf"shard {re.escape(path)} is corrupt.*read 2 of {len(frames)} blocks"):
        _ids(ingest.make_dataset(blocks_copy, batch_size=64, shuffle=False, options=streaming))
    before = ingest.skipped_corrupt_records().get(path, 0)
    ids = _ids(ingest.make_dataset(blocks_copy, batch_size=64, seed=1, skip_corrupt=True))
    shard_rows = info.split("train").shards[1].records
    lost = shard_rows - 2 * K
    assert ingest.skipped_corrupt_records()[path] - before == lost
    assert len(ids) == len(set(ids)) == 1000 - lost


@pytest.mark.slow
def test_input_context_reads_every_row_once_by_files_or_by_blocks(both):
    for pipelines in (2, 3, 5):  # 4 train shards: by files, then by blocks
        seen = []
        for i in range(pipelines):
            ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i)
            seen.extend(_ids(ingest.make_dataset(both[1], batch_size=64, seed=2, input_context=ctx)))
        assert sorted(seen) == list(range(4000)), pipelines


@pytest.mark.parametrize("cache", ["memory", "file"])
def test_cached_blocks_reshuffle_every_epoch(both, tmp_path, cache):
    target = str(tmp_path / "cache") if cache == "file" else cache
    ids = _ids(ingest.make_dataset(both[1], batch_size=64, seed=4, num_epochs=3, cache=target))
    epochs = [ids[k * 4000 : (k + 1) * 4000] for k in range(3)]
    assert all(sorted(e) == list(range(4000)) for e in epochs) and epochs[0] != epochs[1] != epochs[2]


@pytest.mark.slow
def test_blocks_cached_in_memory_are_a_global_shuffle_each_epoch(both):
    # Windows of one block from a one-block buffer: streaming, rows barely leave their block.
    narrow = ingest.ReadOptions(block_window=1, block_shuffle_buffer=1)
    ideal = mixing.ideal_reshare(4000, 64)

    def reshare(**kwargs):
        ds = ingest.make_dataset(both[1], batch_size=64, seed=6, options=narrow, **kwargs)
        first, second = (mixing.batches_of(_ids(ds), 64) for _ in range(2))
        return mixing.reshare_fraction(first, second)

    assert reshare() > 5 * ideal
    # Cached as columns, each epoch permutes every row: the window does not matter.
    assert reshare(cache="memory") < 1.5 * ideal


@pytest.mark.slow
def test_cached_columns_hold_the_values_the_stream_delivers(both):
    def by_id(**kwargs):
        rows = {}
        for x, y in _batches(ingest.make_dataset(both[1], batch_size=100, seed=3, pad_lengths={"tags": 3}, **kwargs)):
            for k, i in enumerate(x["id"]):
                rows[i] = ({name: v[k] for name, v in x.items()}, y[k])
        return rows

    streamed = by_id()
    assert len(streamed) == 4000 and by_id(cache="memory") == streamed
    batches = _batches(ingest.make_dataset(both[1], batch_size=64, cache="memory", num_epochs=2, **_IN_ORDER))
    ids = [i for x, _ in batches for i in x["id"]]
    assert ids == list(range(4000)) * 2  # without shuffle: file order, batches across the epoch boundary
    assert [len(x["id"]) for x, _ in batches] == [64] * 125


def test_auto_cache_counts_the_parsed_columns_against_the_budget(both):
    from ingest.pipeline import _dataset, _read, _request

    def target(budget):
        req = _request.build(
            both[1], cache="auto", batch_size=64, options=ingest.ReadOptions(cache_budget_bytes=budget)
        )
        return _dataset._cache_target(req, _read.shard_plan(req))

    serialized = ingest.load_info(both[1]).split("train").bytes
    assert target(1 << 30) == "memory"
    # Twice the serialized bytes would do for serialized blocks; the parsed columns need more.
    assert target(2 * serialized + 1) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "symbolic, cache", [(False, None), (True, None), (False, "memory")], ids=["plain", "symbolic", "cached-columns"]
)
def test_checkpoint_restores_blocks_mid_epoch_to_the_next_batch(both, tmp_path, symbolic, cache):
    def make():
        opts = ingest.ReadOptions(symbolic_checkpoint=symbolic, block_window=8)
        return ingest.make_dataset(
            both[1], batch_size=50, seed=3, deterministic=True, options=opts, cache=cache, num_epochs=2
        )

    full = _ids(make())
    it = iter(make())
    for _ in range(15):
        next(it)
    ckpt = tf.train.Checkpoint(it=it)
    saved = ckpt.save(str(tmp_path / "ckpt"))
    it2 = iter(make())
    tf.train.Checkpoint(it=it2).restore(saved)
    rest = [r for x, _ in it2 for r in x["id"].numpy().tolist()]
    assert rest == full[15 * 50 :] and len(full) == 8000


@pytest.mark.slow
def test_a_seeded_order_is_the_same_under_the_same_tensorflow_global_seed(both):
    # As tf.data's seeded ops: `seed` and the global seed (tf.random.set_seed,
    # keras.utils.set_random_seed) together decide the order (docs/runtime.md).
    def first_ids(global_seed):
        tf.random.set_seed(global_seed)
        try:
            ds = ingest.make_dataset(both[1], batch_size=16, seed=3, num_epochs=1)
            return next(iter(ds))[0]["id"].numpy().tolist()
        finally:
            tf.random.set_seed(None)

    unset, one = first_ids(None), first_ids(1)
    assert first_ids(None) == unset and first_ids(1) == one and one != unset and first_ids(2) != one


def test_windows_read_by_their_parse_calls_give_the_same_batches(both, monkeypatch):
    # seekable.READS_IN_WINDOW_CALLS, which benchmarks/device_probe.py measures on GPU hosts.
    from ingest.pipeline.blocks import seekable

    def batches():
        ds = ingest.make_dataset(
            both[1], batch_size=64, seed=7, num_epochs=2, options=ingest.ReadOptions(block_window=8)
        )
        return [(x["id"].numpy().tolist(), y.numpy().tolist()) for x, y in ds]

    threaded = batches()
    monkeypatch.setattr(seekable, "READS_IN_WINDOW_CALLS", True)
    assert batches() == threaded and sum(len(ids) for ids, _ in threaded) == 8000


def test_read_records_yields_the_blocks_as_stored(both):
    blocks = [r.numpy() for r in read_records(both[1])]
    held = [b["__rows__"][0] for b in map(_block_dict, blocks)]
    assert len(blocks) == sum(s.blocks for s in ingest.load_info(both[1]).split("train").shards)
    assert sum(held) == 4000 and max(held) == K


@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_tf_data_service_delivers_every_block_row(both, mode):
    # In-process servers: the path through the service is the same as with `ingest service`.
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [
        tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
        for _ in range(2)
    ]
    ds = ingest.make_dataset(both[1], batch_size=64, seed=1, service=dispatcher.target, processing_mode=mode)
    ids = _ids(ds)
    expected = list(range(4000)) * (len(workers) if mode == "parallel_epochs" else 1)
    assert sorted(ids) == sorted(expected)


def test_blocks_of_images_are_refused_naming_the_layout(tmp_path):
    root = tmp_path / "images"
    os.makedirs(root)
    info = contract.DatasetInfo(
        features=(contract.FeatureSpec("image/encoded", "bytes"),),
        splits=(contract.SplitInfo("train", (contract.ShardInfo("train-00000-of-00001.tfrecord", 3, 16, 1),)),),
        image={"feature": "image/encoded"},
        layout="blocks",
        block_rows=K,
    )
    (root / contract.METADATA_FILENAME).write_text(info.to_json())
    (root / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(ValueError, match=r"image dataset in the 'blocks' layout.*--layout rows"):
        ingest.make_dataset(str(root), batch_size=2, image_size=(8, 8))


@pytest.mark.slow
def test_a_checkpoint_after_a_corrupt_block_was_skipped_resumes_to_the_next_batch(blocks_copy, tmp_path):
    path = _shard_path(blocks_copy)
    data = bytearray(open(path, "rb").read())
    frames = _frames(path)
    third = sum(len(f) + 16 for f in frames[:2])
    data[third + 12 + 5] ^= 0xFF  # the third block fails its CRC: the rest of that shard is lost
    open(path, "wb").write(bytes(data))

    def make():
        # skip_corrupt reads in the streaming order, whose plain checkpoint holds its buffers.
        return ingest.make_dataset(blocks_copy, batch_size=64, seed=1, deterministic=True, skip_corrupt=True)

    full = _ids(make())
    before = ingest.skipped_corrupt_records()[path]
    it = iter(make())
    for _ in range(10):  # the shards are small: by now every one has been read, the bad one too
        next(it)
    assert ingest.skipped_corrupt_records()[path] > before
    saved = tf.train.Checkpoint(it=it).save(str(tmp_path / "ckpt"))
    it2 = iter(make())
    tf.train.Checkpoint(it=it2).restore(saved)
    assert [r for x, _ in it2 for r in x["id"].numpy().tolist()] == full[10 * 64 :]


_ITERATE_AND_FIT = """
import sys
import numpy as np, pyarrow as pa, tensorflow as tf
import ingest
from tests.conftest import convert_table

path = convert_table(sys.argv[1], pa.table({"x": np.arange(3000.0), "y": np.arange(3000) % 3}), "--label", "y")
for _ in range(2):
    for batch in ingest.make_dataset(path, batch_size=256, seed=1):
        pass
model = tf.keras.Sequential([tf.keras.layers.Dense(3)])
model.compile("sgd", "sparse_categorical_crossentropy")
ds = ingest.make_dataset(path, batch_size=256, seed=1).map(lambda f, y: (tf.stack([f["x"]], 1), y))
model.fit(ds, epochs=2, verbose=0)
print("done")
"""


@pytest.mark.slow
def test_iterating_the_default_pipeline_and_fitting_on_it_log_no_tf_data_warning(tmp_path):
    # TensorFlow logs from C++ to the process' stderr, at its default level (conftest hides them).
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "PYTHONPATH": os.getcwd()}
    run = subprocess.run(
        [sys.executable, "-c", _ITERATE_AND_FIT, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if re.match(r"W\d{4} .*dataset", line) or "stateful" in line]
    assert not warnings, warnings
