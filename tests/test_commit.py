"""The shard commit's strategies, run directly on fragment files (no Beam, no conversion)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from beam_jobs.encode.tfrecord import TFRecordError, frame_headers, iter_frames, offsets_of, seal_frames
from beam_jobs.output import commit_rows
from beam_jobs.output.fragments import Fragment
from tests.conftest import write_fragments

N = 5000
SMALL = commit_rows.Budget(
    max_merged_runs=64, in_memory_bytes=1 << 20, bucket_bytes=4096, read_bytes=1000, write_bytes=500
)
SHUFFLES = [commit_rows.interleave_runs, commit_rows.permute_in_memory, commit_rows.bucket_on_disk]


def _framed(records: list):
    """TFRecord frames of `records`, back to back, and each frame's length."""
    lengths = np.array([len(r) for r in records], np.int64)
    frame_lengths = lengths + 16
    offsets = offsets_of(frame_lengths)
    buf = np.zeros(int(offsets[-1]), np.uint8)
    headers = frame_headers(lengths)
    for i, r in enumerate(records):
        buf[offsets[i] : offsets[i] + 12] = headers[i]
        buf[offsets[i] + 12 : offsets[i] + 12 + len(r)] = np.frombuffer(r, np.uint8)
    seal_frames(buf, offsets)
    return buf.tobytes(), frame_lengths


def _fragments(tmp, *, fragments=4, runs=5, shuffled_runs=True, bundles=None) -> list:
    """N records 0..N-1 over `fragments` fragments of `runs` runs each, every run in
    random order as ConvertFiles writes them (or in order, for concatenation)."""

    def encode(f, r, values):
        data, lengths = _framed([str(v).encode() for v in values])
        return data, lengths, None

    return write_fragments(
        tmp, encode, n=N, fragments=fragments, runs=runs, shuffled_runs=shuffled_runs, bundles=bundles
    )


def _values(out: io.BytesIO) -> list:
    return [int(bytes(frame[12:-4])) for frame in iter_frames(out.getvalue(), verify=True)]


def test_the_strategy_follows_the_number_of_runs_and_the_bytes():
    def shard(runs, size):
        return [
            Fragment(0, 0, "f", records=runs, bytes=size, order=((0, 0, 0),) * runs, segments=(1,) * runs, rows=runs)
        ]

    budget = commit_rows.Budget(max_merged_runs=8, in_memory_bytes=1000)
    assert commit_rows.choose_strategy(shard(8, 10**9), budget) is commit_rows.interleave_runs
    assert commit_rows.choose_strategy(shard(9, 1000), budget) is commit_rows.permute_in_memory
    assert commit_rows.choose_strategy(shard(9, 1001), budget) is commit_rows.bucket_on_disk


@pytest.mark.parametrize("strategy", SHUFFLES, ids=lambda s: s.__name__)
def test_every_shuffle_keeps_every_record_and_mixes_the_shard(tmp_path, strategy):
    fragments = _fragments(tmp_path)
    out = io.BytesIO()
    assert strategy(fragments, out, np.random.default_rng(3), SMALL) == N
    values = _values(out)
    assert sorted(values) == list(range(N)) and values != sorted(values)
    # Well mixed: the first fifth of the output draws on every fifth of the input.
    assert set(np.array(values[: N // 5]) // (N // 5)) == {0, 1, 2, 3, 4}
    again = io.BytesIO()
    strategy(fragments, again, np.random.default_rng(3), SMALL)
    assert again.getvalue() == out.getvalue()  # a seed gives one order
    other = io.BytesIO()
    strategy(fragments, other, np.random.default_rng(4), SMALL)
    assert other.getvalue() != out.getvalue()


# SMALL reads each run in parts of ~1,000 bytes (each at its own byte offset), the default in one.
@pytest.mark.parametrize("budget", [commit_rows.Budget(), SMALL], ids=["one_read_a_run", "reads_of_1000_bytes"])
def test_without_shuffle_a_shard_keeps_source_order(tmp_path, budget):
    fragments = _fragments(tmp_path, shuffled_runs=False)
    out = io.BytesIO()
    assert commit_rows.write_shard(list(reversed(fragments)), out, rng=None, budget=budget) == N
    assert _values(out) == list(range(N))


@pytest.mark.parametrize("strategy", SHUFFLES + [None], ids=lambda s: s.__name__ if s else "concatenate")
def test_a_shard_is_the_same_bytes_whichever_bundles_wrote_its_runs(tmp_path, strategy):
    # One in-process worker writes a file's chunks into one fragment; two worker processes
    # take turns, so each fragment holds every other chunk of several files.
    def shard(bundles):
        fragments = _fragments(tmp_path / str(bundles), shuffled_runs=strategy is not None, bundles=bundles)
        out = io.BytesIO()
        if strategy is None:
            commit_rows.write_shard(fragments, out, rng=None)
        else:
            strategy(fragments, out, np.random.default_rng(5), SMALL)
        return out.getvalue()

    one = shard(None)
    assert shard(2) == one and shard(3) == one
    if strategy is None:
        assert _values(io.BytesIO(one)) == list(range(N))


@pytest.mark.parametrize("strategy", SHUFFLES + [None], ids=lambda s: s.__name__ if s else "concatenate")
def test_a_shard_of_more_fragments_than_the_reader_keeps_open_is_whole(tmp_path, strategy, monkeypatch):
    # A job with thousands of input files gives a shard a fragment each: the commit keeps
    # a few open at a time (it held one per fragment, past the process's file limit).
    now, most, open_ = [0], [0], commit_rows.FileSystems.open

    class Counted:
        def __init__(self, f):
            self._f = f
            now[0] += 1
            most[0] = max(most[0], now[0])

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def close(self):
            now[0] -= 1
            self._f.close()

    monkeypatch.setattr(commit_rows.FileSystems, "open", lambda *a, **k: Counted(open_(*a, **k)))
    monkeypatch.setattr(commit_rows, "_OPEN_FILES", 3)
    fragments = _fragments(tmp_path, fragments=10, runs=5, shuffled_runs=strategy is not None, bundles=7)
    out = io.BytesIO()
    if strategy is None:
        commit_rows.write_shard(fragments, out, rng=None)
    else:
        budget = SMALL if strategy is not commit_rows.interleave_runs else commit_rows.Budget(max_merged_runs=64)
        strategy(fragments, out, np.random.default_rng(5), budget)
    assert now[0] == 0 and most[0] <= (7 if strategy is commit_rows.interleave_runs else 3)
    assert sorted(_values(out)) == list(range(N))
    if strategy is None:
        assert _values(out) == list(range(N))


@pytest.mark.parametrize("strategy", SHUFFLES + [None], ids=lambda s: s.__name__ if s else "concatenate")
def test_a_truncated_fragment_is_an_error_naming_it(tmp_path, strategy):
    fragments = _fragments(tmp_path)
    with open(fragments[1].path, "r+b") as f:
        f.truncate(fragments[1].bytes - 3)
    with pytest.raises(TFRecordError, match=rf"fragment {fragments[1].path} is truncated"):
        if strategy is None:
            commit_rows.write_shard(fragments, io.BytesIO(), rng=None)
        else:
            strategy(fragments, io.BytesIO(), np.random.default_rng(0), SMALL)


def test_an_index_that_disagrees_with_its_fragment_is_an_error_naming_it(tmp_path):
    fragments = _fragments(tmp_path)
    bad = Fragment(**{**fragments[0].__dict__, "records": fragments[0].records + 1})
    with pytest.raises(TFRecordError, match=rf"fragment {bad.path}: index holds \d+ frames, expected {bad.records}"):
        commit_rows.interleave_runs([bad, *fragments[1:]], io.BytesIO(), np.random.default_rng(0), SMALL)
