"""The blocks layout's shard commit, run directly on fragment files (no Beam, no conversion):
rows shuffled one by one, then cut into blocks; read back with protobuf."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from beam_jobs.encode.tfrecord import iter_frames
from beam_jobs.output import commit_rows
from beam_jobs.output.commit_blocks import run_bytes, write_block_shard
from tests.conftest import write_fragments

N = 5000
K = 64
IN_MEMORY = commit_rows.Budget(in_memory_bytes=64 << 20)
BUCKETS = commit_rows.Budget(in_memory_bytes=1000, bucket_bytes=8192)


def _fragments(tmp, *, fragments=4, runs=5, null_run=False, shuffled_runs=True, bundles=None) -> list:
    """Rows 0..N-1 (an `id` column and a text column) over fragments of runs, each run
    one chunk's share in random order, as ConvertFiles writes them. With `null_run`, one
    run's text column is all null: Arrow types it null there."""

    def encode(f, r, ids):
        text = pa.nulls(len(ids)) if null_run and (f, r) == (1, 2) else pa.array([f"w{i}".encode() for i in ids])
        data = run_bytes([("id", "int64", pa.array(ids)), ("text", "bytes", text)], np.arange(len(ids)))
        return data, [len(data)], len(ids)

    return write_fragments(
        tmp, encode, n=N, fragments=fragments, runs=runs, shuffled_runs=shuffled_runs, bundles=bundles
    )


def _blocks(out: io.BytesIO) -> list:
    import tensorflow as tf

    blocks = []
    for frame in iter_frames(out.getvalue(), verify=True):
        ex = tf.train.Example.FromString(bytes(frame[12:-4]))
        blocks.append({k: list(getattr(v, v.WhichOneof("kind")).value) for k, v in ex.features.feature.items()})
    return blocks


def _ids(blocks: list) -> list:
    return [i for b in blocks for i in b["id"]]


@pytest.mark.parametrize("budget", [IN_MEMORY, BUCKETS], ids=["in_memory", "buckets"])
def test_rows_are_shuffled_one_by_one_before_blocks_are_cut(tmp_path, budget):
    out = io.BytesIO()
    lengths = write_block_shard(_fragments(tmp_path), out, rng=np.random.default_rng(1), block_rows=K, budget=budget)
    blocks = _blocks(out)
    ids = _ids(blocks)
    assert len(lengths) == len(blocks) == -(-N // K) and sorted(ids) == list(range(N))
    assert [b["__rows__"][0] for b in blocks] == [K] * (N // K) + [N % K]  # only the last block is short
    # Each block samples the whole shard, not one chunk: 64 rows drawn from 20 chunks of
    # 250 touch ~19 of them (a block cut from one chunk's share would touch 1).
    assert all(len({i // 250 for i in b["id"]}) >= 12 for b in blocks[:-1])
    assert all(b["text"] == [f"w{i}".encode() for i in b["id"]] for b in blocks)


@pytest.mark.parametrize("budget", [IN_MEMORY, BUCKETS, None], ids=["in_memory", "buckets", "unshuffled"])
def test_a_shard_is_the_same_blocks_whichever_bundles_wrote_its_runs(tmp_path, budget):
    # As two worker processes write them: each fragment holds every other chunk.
    def shard(bundles):
        out, seen = io.BytesIO(), []
        rng = None if budget is None else np.random.default_rng(6)
        write_block_shard(
            _fragments(tmp_path / str(bundles), bundles=bundles, shuffled_runs=budget is not None),
            out,
            rng=rng,
            block_rows=K,
            budget=budget or IN_MEMORY,
            on_rows=lambda columns, n, index: seen.append((index, columns[0][2].to_pylist())),
        )
        return out.getvalue(), seen

    one = shard(None)
    assert shard(2) == one and shard(3) == one  # the statistics see the runs in one order, too


def test_without_shuffle_blocks_hold_consecutive_rows_in_source_order(tmp_path):
    out = io.BytesIO()
    write_block_shard(_fragments(tmp_path, shuffled_runs=False), out, rng=None, block_rows=K)
    blocks = _blocks(out)
    assert _ids(blocks) == list(range(N)) and [b["__rows__"][0] for b in blocks][:-1] == [K] * (N // K)


@pytest.mark.parametrize("budget", [IN_MEMORY, BUCKETS], ids=["in_memory", "buckets"])
def test_a_chunk_whose_column_is_all_null_joins_the_others(tmp_path, budget):
    out = io.BytesIO()
    write_block_shard(
        _fragments(tmp_path, null_run=True), out, rng=np.random.default_rng(2), block_rows=K, budget=budget
    )
    blocks = _blocks(out)
    missing = [b["id"][i] for b in blocks for i in b.get("text/missing", [])]
    assert sorted(missing) == list(range(1 * 1250 + 2 * 250, 1 * 1250 + 3 * 250))
    assert sorted(_ids(blocks)) == list(range(N))
