"""Planning as pure functions: shard counts, splits, assignment; runtime sizing."""

from __future__ import annotations

import numpy as np
import pytest

from beam_jobs.output import shard_plan
from ingest.pipeline import _tuning

MB = 2**20


@pytest.mark.parametrize(
    "size_mb, expected",
    [
        (0.001, 1),  # tiny corpus: one shard, even though it is under 10 MB
        (9, 1),
        (127, 1),
        (129, 2),  # just over the target: two shards of ~65 MB
        (1000, 8),  # 125 MB each
        (100_000, 782),  # a 100 GB split: ~128 MB shards
    ],
)
def test_shard_count_lands_shards_between_10_and_200_mb(size_mb, expected):
    n = shard_plan.plan_num_shards(int(size_mb * MB))
    assert n == expected
    if n > 1:
        assert 10 <= size_mb / n <= 200


def test_small_target_never_plans_shards_under_10_mb():
    assert shard_plan.plan_num_shards(50 * MB, target_shard_mb=1) == 5


def test_target_must_be_positive():
    with pytest.raises(ValueError, match="target shard size must be positive, got 0"):
        shard_plan.plan_num_shards(MB, target_shard_mb=0)


def test_parse_splits():
    assert shard_plan.parse_splits(None) == {"train": 1.0}
    assert shard_plan.parse_splits("train=0.8, eval=0.2") == {"train": 0.8, "eval": 0.2}
    for bad, msg in [
        ("train=0.8,eval=0.1", "must sum to 1"),
        ("train", "NAME=FRACTION"),
        ("a=0.5,a=0.5", "twice"),
        ("1x=1", "invalid"),
        ("a=x", "must be a number"),
        ("a=0,b=1", r"\(0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=msg):
            shard_plan.parse_splits(bad)


def test_split_assignment_follows_fractions_and_is_a_pure_function_of_the_hash():
    hashes = np.random.default_rng(0).integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    splits = shard_plan.assign_splits(hashes, {"a": 0.7, "b": 0.2, "c": 0.1})
    shares = np.bincount(splits, minlength=3) / len(hashes)
    assert np.allclose(shares, [0.7, 0.2, 0.1], atol=0.01)
    assert np.array_equal(splits, shard_plan.assign_splits(hashes.copy(), {"a": 0.7, "b": 0.2, "c": 0.1}))


def test_split_assignment_spreads_sequential_hashes():
    # CRCs of similar records are close together; the mixer must still spread them.
    hashes = np.arange(10_000, dtype=np.uint32)
    shares = np.bincount(shard_plan.assign_splits(hashes, {"a": 0.5, "b": 0.5})) / 10_000
    assert np.allclose(shares, [0.5, 0.5], atol=0.03)


def test_shard_assignment_shuffled_is_reproducible_and_balanced():
    a = shard_plan.assign_shards(10_000, 8, shuffle=True, seed=1, file_index=2, chunk_index=3, first_record=0)
    b = shard_plan.assign_shards(10_000, 8, shuffle=True, seed=1, file_index=2, chunk_index=3, first_record=0)
    assert np.array_equal(a, b)
    assert np.bincount(a).min() > 1100


def test_shard_assignment_unshuffled_is_contiguous_blocks():
    s = shard_plan.assign_shards(2048, 4, shuffle=False, seed=0, file_index=0, chunk_index=0, first_record=0)
    block = shard_plan.NO_SHUFFLE_BLOCK_ROWS
    assert list(s[::block]) == [0, 1, 2, 3]
    assert all(len(set(s[i : i + block])) == 1 for i in range(0, 2048, block))


def test_runtime_cycle_length_and_buffers():
    assert _tuning.cycle_length(16, remote=False, cpu_count=2) == 4
    assert _tuning.cycle_length(3, remote=False, cpu_count=8) == 3
    assert _tuning.cycle_length(100, remote=True, cpu_count=2) == 16
    assert _tuning.cycle_length(100, remote=True, cpu_count=2, requested=5) == 5
    assert _tuning.read_buffer_bytes(remote=True) > _tuning.read_buffer_bytes(remote=False)
    assert _tuning.shuffle_buffer(1_000_000, 332, batch_size=256) == (16 << 20) // 332
    assert _tuning.shuffle_buffer(500, 332, batch_size=256) == 500
    assert _tuning.shuffle_buffer(10**9, 10 << 20, batch_size=32) == 128  # huge records: 4 batches


def test_remote_reads_get_a_call_per_shard_local_reads_autotune():
    assert _tuning.interleave_parallelism(16, remote=True) == 16
    assert _tuning.interleave_parallelism(4, remote=False) is None
    assert _tuning.interleave_parallelism(16, remote=True, requested=3) == 3
    # More calls than the cycle holds is an error in tf.data (one-shard datasets hit it).
    assert _tuning.interleave_parallelism(1, remote=False, requested=2) == 1


def test_runtime_cache_decision():
    assert _tuning.should_cache_in_memory(100 * MB, 1000 * MB)
    assert not _tuning.should_cache_in_memory(600 * MB, 1000 * MB)


def test_file_sharding_covers_every_file_once():
    files = [f"f{i}" for i in range(10)]
    counts = list(range(10, 20))
    plans = [_tuning.shard_files(files, counts, num_pipelines=3, pipeline_id=i) for i in range(3)]
    assert sorted(sum((list(p.files) for p in plans), [])) == sorted(files)
    assert sum(p.records for p in plans) == sum(counts)
    assert all(p.record_shard is None for p in plans)


def test_too_few_files_fall_back_to_record_sharding():
    plans = [_tuning.shard_files(["a", "b"], [5, 6], num_pipelines=3, pipeline_id=i) for i in range(3)]
    assert [p.record_shard for p in plans] == [(3, 0), (3, 1), (3, 2)]
    assert [p.records for p in plans] == [4, 4, 3]
    with pytest.raises(ValueError, match="out of range"):
        _tuning.shard_files(["a"], [1], num_pipelines=2, pipeline_id=2)
