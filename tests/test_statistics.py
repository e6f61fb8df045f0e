"""Statistics recorded at conversion, checked against pandas on the rows each split got.

The corpus has what statistics get wrong: missing values, NaN and infinities, empty
strings, lists (some empty, some missing), a heavy hitter among 30k distinct strings,
a wide int column, binary bytes, several splits, and enough rows that quantiles come
from the sample rather than from every value.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from beam_jobs.stats import features as feature_stats
from ingest import __main__ as cli
from tests.conftest import run_convert

ROWS = 150_000
SPLITS = ("train", "eval")


def _corpus(rows: int = ROWS, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 2.0, rows).astype(np.float32)
    x[rng.random(rows) < 0.02] = np.nan
    x[rng.random(rows) < 0.001] = np.inf
    x[rng.random(rows) < 0.001] = -np.inf
    x[rng.random(rows) < 0.01] = 0.0
    x_null = rng.random(rows) < 0.05
    n = rng.integers(0, 20, rows)
    s = rng.choice(np.array(["red", "green", "", "blue", "a much longer value", "é"], dtype=object), rows)
    hot = rng.random(rows) < 0.05
    ids = np.where(hot, "hot", np.char.add("id", rng.integers(0, 30_000, rows).astype(str))).astype(object)
    lengths = rng.integers(0, 6, rows)
    tags = [list(rng.integers(-5, 50, k)) for k in lengths]
    tags_null = rng.random(rows) < 0.03
    return pa.table(
        {
            "id": pa.array(np.arange(rows)),
            "x": pa.array(x, mask=x_null),
            "n": pa.array(n, mask=rng.random(rows) < 0.1),
            "wide": pa.array(rng.integers(-(10**12), 10**12, rows)),
            "s": pa.array(s, pa.string(), mask=rng.random(rows) < 0.04),
            "ids": pa.array(ids, pa.string()),
            "tags": pa.array([None if m else t for t, m in zip(tags, tags_null)], pa.list_(pa.int64())),
            "blob": pa.array([bytes([255, i % 256, 0]) * (i % 4) for i in range(rows)], pa.binary()),
            "y": pa.array(rng.integers(0, 3, rows)),
        }
    )


def _convert(root, table: pa.Table, *extra, files: int = 4) -> str:
    os.makedirs(root / "in", exist_ok=True)
    step = -(-table.num_rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), root / "in" / f"part-{i}.parquet")
    out = root / "ds"
    run_convert(
        "--source", "parquet", "--input", root / "in" / "*.parquet", "--output", out, "--label", "y",
        "--splits", "train=0.7,eval=0.3", "--layout", "rows", *extra,
    )  # fmt: skip
    return str(out)


def _split_ids(path: str) -> dict:
    out = {}
    for split in SPLITS:
        ds = ingest.make_dataset(path, batch_size=4096, split=split, num_epochs=1, shuffle=False)
        out[split] = np.concatenate([x["id"].numpy() for x, _ in ds])
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    table = _corpus()
    path = _convert(root, table)
    return table, path, _split_ids(path)


def _rank_error(quantiles, values) -> float:
    """The largest distance between each recorded quantile's rank and the rank asked for."""
    v = np.sort(values)
    worst = 0.0
    for i, q in enumerate(quantiles):
        want = i / (len(quantiles) - 1)
        below, at_most = np.searchsorted(v, q, "left") / len(v), np.searchsorted(v, q, "right") / len(v)
        worst = max(worst, 0.0 if below <= want <= at_most else min(abs(below - want), abs(at_most - want)))
    return worst


def _check_number(st, col: pa.Array, *, records: bool = True):
    """`col`: the Arrow column, where a null (missing) is not a NaN (a value); `records`:
    whether its values are records (not a list feature's elements)."""
    present = col.drop_null()
    values = present.to_numpy(zero_copy_only=False)
    finite = values[np.isfinite(values)]
    if records:
        assert st.count == len(present) and st.missing == len(col) - len(present)
    assert st.nan == int(np.isnan(values).sum()) and st.inf == int(np.isinf(values).sum())
    assert st.neg_inf == int((values == -np.inf).sum())
    assert st.zeros == int((finite == 0).sum())
    numbers = values[~np.isnan(values)]  # infinities are the extremes where there are any
    assert (st.min, st.max) == (numbers.min(), numbers.max())
    assert st.mean == pytest.approx(finite.astype(np.float64).mean(), rel=1e-9, abs=1e-12)
    assert st.std == pytest.approx(finite.astype(np.float64).std(), rel=1e-9)
    assert len(st.quantiles) == 101 and (st.quantiles[0], st.quantiles[-1]) == (finite.min(), finite.max())
    assert _rank_error(st.quantiles, finite) <= 0.01


def _keras_order(counts: pd.Series) -> list:
    """Most frequent first, ties by the larger value (bytes), as Keras lookups order them."""
    items = [(v, int(c)) for v, c in counts.items()]
    key = (lambda vc: (vc[1], vc[0].encode())) if items and isinstance(items[0][0], str) else (lambda vc: vc[::-1])
    return sorted(items, key=key, reverse=True)


# Over 5 s on a busy 2-core machine (a two-worker run, 2026-12-03): the slow tier.
@pytest.mark.slow
def test_statistics_per_split_and_overall_match_pandas(converted):
    table, path, ids = converted
    info = ingest.load_info(path)
    assert sorted(info.statistics.splits) == sorted(SPLITS)
    for split in (*SPLITS, None):
        part = table if split is None else table.take(np.sort(ids[split]))
        rows = part.to_pandas()
        st = info.statistics.of(split)
        for name in ("x", "n", "wide"):
            _check_number(st[name], part.column(name).combine_chunks())
        for name in ("n", "y"):  # few values: exact counts, the whole vocabulary
            counts = rows[name].dropna().astype(np.int64).value_counts()
            assert st[name].distinct_exact and st[name].distinct == len(counts)
            assert [(t.value, t.count) for t in st[name].top] == _keras_order(counts)
        assert st["wide"].distinct is None and st["wide"].top == ()  # a measure: no vocabulary
        s = rows["s"].dropna()
        assert (st["s"].count, st["s"].missing) == (len(s), len(rows) - len(s))
        assert [(t.value, t.count) for t in st["s"].top] == _keras_order(s.value_counts())
        assert st["s"].vocabulary == [v for v, _ in _keras_order(s.value_counts())]
        lengths = s.map(lambda v: len(v.encode()))
        assert (st["s"].length.min, st["s"].length.max) == (0, lengths.max())
        assert st["s"].length.mean == pytest.approx(lengths.mean())
        tags = rows["tags"].dropna()
        flat = np.concatenate([np.asarray(t, np.int64) for t in tags])
        assert (st["tags"].count, st["tags"].values) == (len(tags), len(flat))
        tag_lengths = tags.map(len)
        ll = st["tags"].list_length
        assert (ll.min, ll.max, ll.mean) == (0, 5, pytest.approx(tag_lengths.mean()))
        assert len(ll.quantiles) == 11 and _rank_error(ll.quantiles, tag_lengths.to_numpy()) <= 0.01
        _check_number(st["tags"], pa.array(flat), records=False)  # numbers over every element
        blob = st["blob"]  # binary: distinct (by digest) and lengths, no top of raw bytes
        assert blob.distinct_exact and blob.distinct == rows["blob"].nunique() and blob.top == ()
        assert blob.length.max == 9 and blob.mean is None


def test_text_under_the_vocabulary_limit_is_counted_exactly_in_every_split(converted):
    """30k distinct values: under the vocabulary's limit, so the statistics of every split
    and of all of them count them exactly, as pandas does (a frequent-items sketch gave each
    split's before; the sketched path is tested past the limit, below)."""
    table, path, ids = converted
    df = table.to_pandas()
    info = ingest.load_info(path)
    for split in (*SPLITS, None):
        rows = df if split is None else df.iloc[np.sort(ids[split])]
        st = info.statistics.of(split)["ids"]
        truth = rows["ids"].value_counts()
        assert st.distinct_exact and st.distinct == len(truth) and st.top_exact
        assert (st.distinct_error, st.top_error) == (None, None)
        assert [(t.value, t.count) for t in st.top] == _keras_order(truth)[: feature_stats.TOP_STORED]
        assert st.top[0].value == "hot"


@pytest.mark.slow
def test_two_worker_runner_merges_to_the_same_statistics(converted, tmp_path):
    table, path, _ = converted
    two = _convert(tmp_path, table, "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    one, other = ingest.load_info(path).statistics, ingest.load_info(two).statistics
    ids = _split_ids(two)
    for split in (*SPLITS, None):
        a, b = one.of(split), other.of(split)
        for name in a:
            fa, fb = _fields(a[name]), _fields(b[name])
            sampled = _SAMPLED | ({"distinct", "top", "top_error"} if not fa["distinct_exact"] else set())
            assert {k: v for k, v in fa.items() if k not in sampled} == {
                k: v for k, v in fb.items() if k not in sampled
            }, name
            for k in ("mean", "std"):  # the same sums, added in another order
                assert fa[k] == pytest.approx(fb[k], rel=1e-9, abs=1e-12) if fa[k] is not None else fb[k] is None
        part = table if split is None else table.take(np.sort(ids[split]))
        _check_number(b["x"], part.column("x").combine_chunks())


@pytest.mark.slow
def test_blocks_layout_gathers_the_same_statistics_in_its_commit(converted, tmp_path):
    """Blocks gather statistics as each shard's runs of rows are read in the commit, rows
    as each chunk is read: the same numbers, merged over three shards a split and the
    several runs (input chunks) of each."""
    table, path, _ = converted
    s = str(_convert(tmp_path, table, "--layout", "blocks", "--num_shards", "3"))
    blocks, rows = ingest.load_info(s), ingest.load_info(path)
    assert blocks.layout == "blocks" and len(blocks.split("train").shards) == 3
    ids = _split_ids(s)
    for split in (*SPLITS, None):
        a, b = rows.statistics.of(split), blocks.statistics.of(split)
        assert sorted(a) == sorted(b)
        for name in a:
            fa, fb = _fields(a[name]), _fields(b[name])
            sampled = _SAMPLED | ({"distinct", "top", "top_error"} if not fa["distinct_exact"] else set())
            assert {k: v for k, v in fa.items() if k not in sampled} == {
                k: v for k, v in fb.items() if k not in sampled
            }, (split, name)
            for k in ("mean", "std"):
                assert fa[k] == pytest.approx(fb[k], rel=1e-9, abs=1e-12) if fa[k] is not None else fb[k] is None
        part = table if split is None else table.take(np.sort(ids[split]))
        _check_number(b["x"], part.column("x").combine_chunks())


def test_csv_blocks_gather_statistics_while_reading_and_match_pandas(tmp_path):
    """CSV gathers the blocks layout's statistics in ConvertFiles, beside its reader
    (`Source.statistics_while_reading`), Parquet in the commit: both must be exact."""
    rng = np.random.default_rng(3)
    rows = 20_000
    df = pd.DataFrame(
        {
            "id": np.arange(rows),
            "x": np.round(rng.normal(5, 2, rows), 3),
            "s": rng.choice(["red", "green", "blue"], rows),
            "y": rng.integers(0, 3, rows),
        }
    )
    df.loc[rng.random(rows) < 0.05, "x"] = np.nan  # empty cells: missing
    os.makedirs(tmp_path / "in")
    df.to_csv(tmp_path / "in" / "a.csv", index=False)
    out = tmp_path / "ds"
    run_convert(
        "--source", "csv", "--input", tmp_path / "in" / "a.csv", "--output", out, "--label", "y",
        "--splits", "train=0.7,eval=0.3", "--num_shards", "2",
    )  # fmt: skip
    info = ingest.load_info(str(out))
    assert info.layout == "blocks"
    ids = _split_ids(str(out))
    for split in (*SPLITS, None):
        part = df if split is None else df.iloc[np.sort(ids[split])]
        st = info.statistics.of(split)
        _check_number(st["x"], pa.array(part["x"].to_numpy(np.float32), mask=part["x"].isna().to_numpy()))
        assert [(t.value, t.count) for t in st["s"].top] == _keras_order(part["s"].value_counts())
        assert st["y"].count == len(part) and st["y"].distinct == part["y"].nunique()


_SAMPLED = {"quantiles", "list_length", "mean", "std"}  # from a sample, or sums in another order


def _fields(s) -> dict:
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(s).items()}


def test_no_statistics_flag_records_none_and_says_so(tmp, capsys):
    path = _convert(tmp, _corpus(2000), "--no_statistics", files=1)
    info = ingest.load_info(path)
    assert info.statistics is None and info.options["statistics"] is False
    with pytest.raises(ValueError, match=r"has no statistics: it was converted with --no_statistics"):
        ingest.feature_space(path)
    assert cli.main(["describe", path]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no statistics: it was converted with --no_statistics" in err[0]


# --- the accumulators alone ---------------------------------------------------------------


def _stats_of(parts, dtype="float32"):
    keys_seed = 0
    acc = feature_stats.FeatureStats(dtype, "number", False)
    for p in parts:
        piece = feature_stats.FeatureStats(dtype, "number", False)
        piece.add(pa.array(p), feature_stats.chunk_keys(len(p), [keys_seed]))
        keys_seed += 1
        acc.merge(piece)
    return acc.to_json()


@pytest.mark.parametrize(
    "parts, lo, hi",
    [
        ([[1.0, -np.inf]], -np.inf, 1.0),
        ([[1.0], [np.inf, 2.5]], 1.0, np.inf),
        ([[-np.inf], [-np.inf, np.nan]], -np.inf, -np.inf),  # no finite value: the extremes still say which
        ([[np.inf, -np.inf, 3.0, np.nan]], -np.inf, np.inf),
    ],
)
def test_min_and_max_are_the_infinities_where_there_are_any(parts, lo, hi):
    d = _stats_of(parts)
    values = np.concatenate(parts)
    assert (d["min"], d["max"]) == (lo, hi)
    assert (d["inf"], d["neg_inf"]) == (int(np.isinf(values).sum()), int((values == -np.inf).sum()))
    finite = values[np.isfinite(values)]
    ends = (d["quantiles"][0], d["quantiles"][-1]) if len(finite) else ()
    assert ends == ((finite.min(), finite.max()) if len(finite) else ())  # the quantiles stay finite
    # Read back from the metadata's JSON, and merged as spans are.
    from ingest.statistics import FeatureStatistics, Statistics, merge

    st = FeatureStatistics.from_json(json.loads(json.dumps(d)), "x")
    assert (st.min, st.max, st.neg_inf) == (lo, hi, d["neg_inf"])
    halves = [Statistics({"x": FeatureStatistics.from_json(_stats_of([p]), "x")}, {}) for p in parts]
    merged = merge(halves).overall["x"]
    assert (merged.min, merged.max, merged.inf, merged.neg_inf) == (lo, hi, d["inf"], d["neg_inf"])


def test_moments_merge_stably_far_from_zero():
    rng = np.random.default_rng(3)
    values = (1e9 + rng.normal(0, 1, 100_000)).astype(np.float64)
    parts = np.array_split(values, 37)
    got = _stats_of(parts)
    stored = values.astype(np.float32).astype(np.float64)  # what a float32 feature holds
    assert got["mean"] == pytest.approx(stored.mean(), rel=1e-12)
    # A sum of squares minus the squared mean would lose most digits here (1e18 vs ~1e2).
    assert got["std"] == pytest.approx(stored.std(), rel=1e-9)


def test_quantiles_hold_their_rank_bound_on_skewed_data_split_in_uneven_parts():
    rng = np.random.default_rng(5)
    for trial in range(3):
        # Sorted, so each part holds its own range: a sample that favoured some parts fails.
        values = np.sort(rng.lognormal(0, 2, 400_000).astype(np.float32))
        cuts = np.sort(rng.choice(np.arange(1, len(values)), 20, replace=False))
        got = _stats_of(np.split(values, cuts))
        assert _rank_error(got["quantiles"], values) <= 0.01, trial


def test_counts_switch_to_sketches_when_merged_past_the_exact_limit():
    from ingest import contract

    limit = contract.VOCABULARY_LIMIT  # text's: as many as a vocabulary holds
    halves = [np.array([f"v{i}" for i in range(k * limit // 2 + k, (k + 2) * limit // 2 + k)], object) for k in (0, 1)]
    acc = feature_stats.FeatureStats("bytes", "text", False)
    for h in halves:  # each bundle alone stays exact; together they do not
        piece = feature_stats.FeatureStats("bytes", "text", False)
        piece.add(pa.array([v.encode() for v in h], pa.large_binary()), feature_stats.chunk_keys(len(h), [0]))
        assert piece.to_json()["distinct_exact"]
        acc.merge(piece)
    got = acc.to_json()
    truth = len(set(halves[0]) | set(halves[1]))
    assert not got["distinct_exact"] and abs(got["distinct"] - truth) <= got["distinct_error"] * truth


def test_sketched_text_holds_its_recorded_bounds_bad_utf8_replaced():
    """Past the exact counts, `distinct` is within `distinct_error` of the true count, each
    top count within `top_error` above its own, and no value more frequent than twice that
    is left out (Misra-Gries), the truth counted by collections.Counter."""
    from collections import Counter

    rng = np.random.default_rng(4)
    chunks = []
    for k in range(4):
        # ~160k distinct ids in all: past the exact counts (2**17) after the fourth chunk
        values = [b"id-%d" % x for x in rng.integers(0, 10**7, 40_000)] + [b"w%d" % (k % 3)] * 500
        values += [b"\xff\xfe%d" % k] * 300 if k == 0 else []  # not UTF-8: decoded with U+FFFD
        chunks.append(pa.array(values, pa.large_binary()))
    acc = feature_stats.FeatureStats("bytes", "text", False)
    for i, chunk in enumerate(chunks):
        acc.add(chunk, feature_stats.chunk_keys(len(chunk), [i]))
    got = acc.to_json()
    truth = Counter(v.decode("utf-8", "replace") for c in chunks for v in c.to_pylist())
    assert not got["distinct_exact"] and not got["top_exact"]
    assert abs(got["distinct"] - len(truth)) <= got["distinct_error"] * len(truth)
    top = {t["value"]: t["count"] for t in got["top"]}
    assert all(truth[v] <= c <= truth[v] + got["top_error"] for v, c in top.items()), got["top_error"]
    assert {v for v, c in truth.items() if c > 2 * got["top_error"]} <= set(top)
    assert "\ufffd\ufffd0" in top and top["w0"] >= 1000


def test_binary_values_are_counted_by_digest_past_the_exact_limit():
    rng = np.random.default_rng(9)
    blobs = [rng.bytes(int(k)) for k in rng.integers(8, 40, 30_000)]
    acc = feature_stats.FeatureStats("bytes", "binary", False)
    for i, at in enumerate(range(0, len(blobs), 7_000)):
        part = blobs[at : at + 7_000]
        acc.add(pa.array(part, pa.large_binary()), feature_stats.chunk_keys(len(part), [i]))
    got = acc.to_json()
    assert not got["distinct_exact"] and got["distinct"] == pytest.approx(len(set(blobs)), rel=0.02)
    assert "top" not in got and got["length"]["min"] == 8


def test_statistics_round_trip_and_a_malformed_entry_is_named(converted, tmp_path):
    _, path, _ = converted
    info = ingest.load_info(path)
    again = ingest.DatasetInfo.from_json(info.to_json())
    assert again.statistics == info.statistics
    meta = json.loads(info.to_json())
    meta["statistics"]["splits"]["eval"]["x"]["count"] = -1
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(ingest.DatasetInfoError, match=r"metadata\.statistics\.splits\['eval'\]\['x'\]\.count must be"):
        ingest.load_info(str(broken))


def test_metadata_lays_out_one_statistic_a_line(converted):
    """The statistics are written by json's C encoder, not `indent=2`'s Python one: the
    file must still read as well, one field of a feature a line, lists on it."""
    _, path, _ = converted
    with open(os.path.join(path, "dataset_info.json")) as f:
        text = f.read()
    info = ingest.load_info(path)
    features = len(info.features)
    assert len(re.findall(r'^ {8,10}"count": \d+,$', text, re.M)) == features * (1 + len(SPLITS))
    quantile_lines = re.findall(r'^ +"quantiles": (\[.*\]),$', text, re.M)
    assert quantile_lines and all(len(json.loads(q)) == 101 for q in quantile_lines)
    assert text.startswith('{\n  "format_version": ') and text.endswith("\n  }\n}")
    assert json.loads(text)["statistics"] == info.statistics.to_json()


def _bundle_stats(seed: int, rows: int, chunks: int):
    """One bundle's ConversionStats over `chunks` chunks: dense columns (which sample the
    same rows), one with missing values (other rows), a label and a wide int column."""
    from beam_jobs.stats.conversion import ConversionStats

    rng = np.random.default_rng(seed)
    stats = ConversionStats()
    kinds = {"a": "number", "b": "number", "gappy": "number", "label": "number", "wide": "number"}
    for i in range(chunks):
        cols = [
            ("a", "float32", pa.array(rng.normal(0, 1, rows).astype(np.float32))),
            ("b", "float32", pa.array(rng.lognormal(0, 1, rows).astype(np.float32))),
            ("gappy", "float32", pa.array(rng.normal(5, 1, rows).astype(np.float32), mask=rng.random(rows) < 0.3)),
            ("label", "int64", pa.array(rng.integers(-3, 7, rows))),
            ("wide", "int64", pa.array(rng.integers(-(2**62), 2**62, rows))),
        ]
        split_of = rng.integers(0, 2, rows)
        stats.add_statistics(cols, kinds, split_of, SPLITS, feature_stats.chunk_keys(rows, [seed, i]))
    return stats


def test_packed_statistics_pickle_shared_keys_once_and_narrow_integers_losing_nothing():
    import copy
    import pickle

    from beam_jobs.stats.conversion import ConversionStats

    stats = _bundle_stats(1, 40_000, 4)  # 80k rows a split: samples lowered, some over SAMPLE_SIZE
    before = copy.deepcopy(stats)
    expected = before.statistics_json(SPLITS)
    samples = {(s, n): f.sample._joined() for s, fs in before.statistics.items() for n, f in fs.items()}
    blob = stats.pack()
    back = ConversionStats.unpack(blob)
    for split, features in back.statistics.items():
        for name, f in features.items():
            values, keys = f.sample._joined()
            want_values, want_keys = samples[(split, name)]
            np.testing.assert_array_equal(values, want_values)
            np.testing.assert_array_equal(keys, want_keys)
        dense = [features[n].sample._joined()[1] for n in ("a", "b", "label", "wide")]
        assert all(k is dense[0] for k in dense)  # one array, pickled once
        assert features["gappy"].sample._joined()[1] is not dense[0]
        assert features["label"].sample._joined()[0].dtype == np.int8
        assert features["wide"].sample._joined()[0].dtype == np.int64
    assert back.statistics_json(SPLITS) == expected
    each = sum(len(pickle.dumps(f, protocol=5)) for fs in before.statistics.values() for f in fs.values())
    keys_bytes = sum(len(samples[(s, "a")][1]) * 4 for s in SPLITS)
    assert len(blob) < each - 3 * keys_bytes  # three of the four dense features' keys not pickled


def test_merging_packed_statistics_equals_merging_them_unpacked():
    from beam_jobs.stats.conversion import ConversionStats

    blobs = [
        _bundle_stats(seed, rows, chunks).pack() for seed, rows, chunks in ((2, 30_000, 3), (3, 500, 1), (4, 9_000, 2))
    ]
    copied = ConversionStats.merge(ConversionStats.unpack(b) for b in blobs).statistics_json(SPLITS)
    in_place = ConversionStats.unpack(ConversionStats.merge_packed(blobs)).statistics_json(SPLITS)
    for split in SPLITS:
        for name, want in copied["splits"][split].items():
            got = in_place["splits"][split][name]
            assert got.pop("mean") == pytest.approx(want.pop("mean"), rel=1e-12)  # merged in another order
            assert got.pop("std") == pytest.approx(want.pop("std"), rel=1e-12)
            assert got == want, (split, name)
    assert ConversionStats.unpack(ConversionStats.merge_packed([])).statistics == {}


def test_value_counts_add_up_across_many_parts():
    from collections import Counter

    rng = np.random.default_rng(11)
    parts = [rng.choice(np.array([f"w{i}" for i in range(900)]), int(n)) for n in rng.integers(1, 4_000, 40)]
    counts = feature_stats._Counts("text")
    for p in parts:  # more than EXACT_VALUES distinct-per-part rows: compacted on the way
        counts.add(pa.array(p, pa.large_string()))
    got = {t["value"]: t["count"] for t in counts.result(text=True)["top"]}
    assert got == Counter(np.concatenate(parts).tolist())


def test_int64_quantiles_stay_exact_through_merges():
    # Past 2**53 a float64 cannot hold these values: a sample made float64 anywhere on
    # the way (merged into a new accumulator, packed, merged packed) rounds them. Parts
    # of over 2 * SAMPLE_SIZE values have lowered their threshold before they merge.
    rng = np.random.default_rng(12)
    values = 2**60 + 7 * rng.integers(0, 10**6, 300_000)
    got = _stats_of(np.array_split(values, 3), dtype="int64")
    assert set(got["quantiles"]) <= set(values.tolist())


def test_long_text_values_are_stored_and_described_cut_not_whole(tmp):
    # Whole, 100 KB values made a 40 MB dataset_info.json, and describe printed them.
    cap = 256  # as docs/statistics.md says
    long = [c * 100_000 for c in "abcd"]
    table = pa.table({"doc": pa.array(long * 50 + ["short"] * 10), "n": pa.array(range(210))})
    os.makedirs(tmp / "in")
    pq.write_table(table, tmp / "in" / "a.parquet")
    run_convert("--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "ds")
    assert os.path.getsize(tmp / "ds" / "dataset_info.json") < 100_000
    st = ingest.load_info(str(tmp / "ds")).statistics.feature("doc")
    assert (st.distinct, st.distinct_exact, st.length.max) == (5, True, 100_000)  # counted whole
    assert [(t.value, t.count) for t in st.top] == [(c * (cap - 1) + "…", 50) for c in "dcba"] + [("short", 10)]
    assert st.top_exact is False and st.vocabulary is None  # cut values are no vocabulary
    assert cli.main(["describe", str(tmp / "ds")]) == 0
    # Past the exact counts, the frequent-items sketch's values are cut too.
    acc = feature_stats.FeatureStats("bytes", "text", False)
    from ingest import contract

    values = [b"%06d" % i for i in range(contract.VOCABULARY_LIMIT + 1)] + [c * 1000 for c in (b"x", b"y")] * 50
    acc.add(pa.array(values, pa.large_binary()), feature_stats.chunk_keys(len(values), [0]))
    got = acc.to_json()
    assert not got["distinct_exact"] and [t["value"] for t in got["top"]] == [c * (cap - 1) + "…" for c in "yx"]
    assert all(len(t["value"]) <= cap for t in got["top"])


def test_describe_prints_a_long_value_cut(tmp, capsys):
    table = pa.table({"doc": pa.array(["y" * 200] * 3 + ["z"])})
    os.makedirs(tmp / "in")
    pq.write_table(table, tmp / "in" / "a.parquet")
    run_convert("--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "ds")
    capsys.readouterr()
    assert cli.main(["describe", str(tmp / "ds")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| doc |"))
    assert re.search(r"'y{20,}…", row) and len(row) < 200


def test_describe_escapes_pipes_and_plot_names_the_features_it_leaves_out(tmp, capsys):
    """A `|` in a value ended its markdown cell (the row had a column too many); --plot drew 24
    features and said nothing of the others."""
    columns = {f"n{i:02d}": pa.array(np.arange(40) % (i + 2)) for i in range(25)}
    table = pa.table(
        {
            "pipe": pa.array(["a|b"] * 30 + ["c"] * 10),
            **columns,
            "blob": pa.array([bytes([i, 255]) for i in range(40)], pa.binary()),
        }
    )
    os.makedirs(tmp / "in")
    pq.write_table(table, tmp / "in" / "a.parquet")
    run_convert("--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "ds")
    capsys.readouterr()
    assert cli.main(["describe", str(tmp / "ds"), "--plot", str(tmp / "d.png")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| feature |"))
    row = next(line for line in lines if line.startswith("| pipe |"))
    cells = re.split(r"(?<!\\)\|", row)
    assert len(cells) == len(header.split("|")) and r"'a\|b' 75.0%" in row, row
    left = next(line for line in lines if line.startswith("left out of it"))
    # 25 numbers and one text feature have panels: the first 24 are drawn.
    assert (
        left == "left out of it (3): n23 (past the first 24 panels); n24 (past the first 24 panels); "
        "blob (bytes: only its distinct count is recorded)"
    ), left
    assert "wrote " + str(tmp / "d.png") + " (24 features)" in out and os.path.getsize(tmp / "d.png") > 0


def _strict_json(text: str):
    """json.loads as RFC 8259 reads: a bare Infinity, -Infinity or NaN is an error (JavaScript's
    JSON.parse and Go's encoding/json refuse them; Python reads them by default)."""

    def refuse(token):
        raise ValueError(f"not strict JSON: bare {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def infinite(tmp_path_factory) -> str:
    """A small dataset whose float column holds -inf, +inf and NaN."""
    root = tmp_path_factory.mktemp("inf")
    src = root / "in.csv"
    src.write_text("x,n\n" + "".join(f"{v},{i}\n" for i, v in enumerate(["1.5", "-inf", "inf", "nan", "2.5", "0"])))
    run_convert("--source", "csv", "--input", src, "--output", root / "ds")
    return str(root / "ds")


def test_metadata_is_strict_json_with_the_infinities_as_strings_read_back_as_floats(infinite, tmp_path):
    # They were written as bare Infinity tokens, which JavaScript's and Go's parsers refuse.
    text = open(os.path.join(infinite, "dataset_info.json")).read()
    x = _strict_json(text)["statistics"]["overall"]["x"]
    assert (x["min"], x["max"], x["nan"], x["inf"], x["neg_inf"]) == ("-Infinity", "Infinity", 1, 2, 1)
    st = ingest.load_info(infinite).statistics.feature("x")
    assert st.min == -np.inf and st.max == np.inf and st.mean == pytest.approx(4 / 3)
    if shutil.which("node"):  # the reader the convention is for, where there is one
        subprocess.run(
            ["node", "-e", "JSON.parse(require('fs').readFileSync(0, 'utf8'))"], input=text, text=True, check=True
        )
    # Metadata written before (bare tokens, which Python reads) still loads, to the same statistics.
    old = tmp_path / "old"
    shutil.copytree(infinite, old)
    (old / "dataset_info.json").write_text(
        json.dumps(json.loads(text.replace('"-Infinity"', "-Infinity").replace('"Infinity"', "Infinity")))
    )
    assert "Infinity," in (old / "dataset_info.json").read_text()
    assert ingest.load_info(str(old)).statistics == ingest.load_info(infinite).statistics
    # A float32 default that is not finite is written and read the same way.
    info = ingest.DatasetInfo(features=(ingest.FeatureSpec("x", "float32", default=float("-inf")),), splits=())
    assert _strict_json(info.to_json())["features"][0]["default"] == "-Infinity"
    assert ingest.DatasetInfo.from_json(info.to_json()).features[0].default == -np.inf


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "mean",
            "lots",
            r"\['x'\]\.mean must be a number \(or \"Infinity\", \"-Infinity\", \"NaN\"\), got a string 'lots'",
        ),
        ("std", -1.0, r"\['x'\]\.std must be at least 0, got -1\.0"),
        ("min", True, r"\['x'\]\.min must be a number .*got true or false True"),
        ("quantiles", [1.0, "2"], r"\['x'\]\.quantiles\[1\] must be a number"),
        ("nan", 1.5, r"\['x'\]\.nan must be a non-negative integer, got a number 1\.5"),
        ("distinct_exact", "yes", r"\['x'\]\.distinct_exact must be true, false or null"),
        ("top", [{"value": 1, "count": "3"}], r"\['x'\]\.top\[0\]\.count must be a non-negative integer"),
        ("length", {"min": 0, "max": 3, "mean": "x"}, r"\['x'\]\.length\.mean must be a finite number"),
    ],
)
def test_every_statistics_field_is_type_checked_on_load_naming_file_feature_and_field(
    infinite, tmp_path, field, value, message
):
    # `mean = "lots"` was loaded, and failed later in describe or feature_space.
    meta = json.loads(open(os.path.join(infinite, "dataset_info.json")).read())
    meta["statistics"]["overall"]["x"][field] = value
    broken = tmp_path / "broken"
    shutil.copytree(infinite, broken)
    (broken / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(
        ingest.DatasetInfoError, match=r"broken/dataset_info\.json .*metadata\.statistics\.overall" + message
    ):
        ingest.load_info(str(broken))


@pytest.mark.parametrize("classes", [feature_stats.EXACT_VALUES, feature_stats.EXACT_VALUES + 1])
def test_a_text_labels_classes_stop_at_the_exact_values_limit_not_the_vocabularys(classes):
    """Text is counted exactly up to the vocabulary's 2**17 values, but a label records its
    classes up to EXACT_VALUES only, as before: past them, none (and a warning)."""
    from beam_jobs.stats.conversion import ConversionStats

    stats = ConversionStats()
    values = pa.array([b"c%05d" % i for i in range(classes)] * 2, pa.large_binary())
    split_of = np.arange(len(values)) % 2  # both splits hold every class
    stats.add_statistics(
        [("y", "bytes", values)], {"y": "text"}, split_of, SPLITS, feature_stats.chunk_keys(len(values), [0])
    )
    got = stats.distinct_values("y")
    assert got is None if classes > feature_stats.EXACT_VALUES else sorted(got) == [f"c{i:05d}" for i in range(classes)]
    assert stats.statistics_json(SPLITS)["overall"]["y"]["distinct"] == classes  # counted exactly all the same


# --- past the exact counts, in a conversion ---------------------------------------------------


def _urls(rows: int, seed: int) -> pa.Table:
    """URLs that rarely repeat (past the 2**17 values counted exactly), two of them frequent."""
    rng = np.random.default_rng(seed)
    url = np.char.add("https://shop.example.com/p/", rng.integers(0, 10**9, rows).astype(str)).astype(object)
    share = rng.random(rows)
    url[share < 0.05] = "https://shop.example.com/"
    url[(share >= 0.05) & (share < 0.06)] = "https://shop.example.com/cart"
    return pa.table({"url": pa.array(url, pa.string()), "word": pa.array(rng.choice(["a", "b", "c"], rows))})


@pytest.fixture(scope="module")
def sketched(tmp_path_factory):
    """Two files: the first passes the exact counts within its bundle, the second only in the merge."""
    root = tmp_path_factory.mktemp("sketched")
    table = _urls(220_000, 6)
    os.makedirs(root / "in")
    pq.write_table(table.slice(0, 170_000), root / "in" / "a.parquet")
    pq.write_table(table.slice(170_000), root / "in" / "b.parquet")
    run_convert("--source", "parquet", "--input", root / "in" / "*.parquet", "--output", root / "ds")
    return table, str(root / "ds")


def test_text_past_the_vocabulary_limit_is_estimated_within_its_recorded_bounds(sketched):
    from collections import Counter

    from beam_jobs.stats import sketches
    from ingest import contract

    table, path = sketched
    truth = Counter(table.column("url").to_pylist())
    assert len(truth) > contract.VOCABULARY_LIMIT
    st = ingest.load_info(path).statistics
    for url in (st.feature("url"), *(features["url"] for features in st.splits.values())):  # one split: the same rows
        assert not url.distinct_exact and url.distinct_error == sketches.DISTINCT_ERROR
        assert abs(url.distinct - len(truth)) <= url.distinct_error * len(truth)
        assert not url.top_exact and 0 < url.top_error <= table.num_rows / (sketches.FREQUENT_K + 1)
        top = {t.value: t.count for t in url.top}
        assert all(truth[v] <= c <= truth[v] + url.top_error for v, c in top.items()), url.top_error
        assert {v for v, c in truth.items() if c > 2 * url.top_error} <= set(top)
        assert list(top)[:2] == ["https://shop.example.com/", "https://shop.example.com/cart"]
    word = st.feature("word")  # beside it, exact counts stay exact, with no bound
    want = Counter(table.column("word").to_pylist())
    assert [(t.value, t.count) for t in word.top] == sorted(want.items(), key=lambda vc: (vc[1], vc[0]), reverse=True)
    assert word.distinct_exact and (word.distinct_error, word.top_error) == (None, None)


def test_describe_compare_and_merge_read_metadata_with_and_without_the_error_bounds(sketched, tmp_path, capsys):
    """Metadata recorded before `distinct_error` and `top_error` existed loads, describes,
    compares and merges as the new does: the bounds alone are missing."""
    import dataclasses

    from ingest import statistics

    _, path = sketched
    old = tmp_path / "old"
    shutil.copytree(path, old)
    meta = json.loads((old / "dataset_info.json").read_text())
    for features in (meta["statistics"]["overall"], *meta["statistics"]["splits"].values()):
        for f in features.values():
            f.pop("distinct_error", None)
            f.pop("top_error", None)
    (old / "dataset_info.json").write_text(json.dumps(meta))
    new_url, old_url = (ingest.load_info(str(p)).statistics.feature("url") for p in (path, old))
    assert new_url.distinct_error is not None and new_url.top_error is not None
    assert (old_url.distinct_error, old_url.top_error) == (None, None)
    assert dataclasses.replace(new_url, distinct_error=None, top_error=None) == old_url
    rows = {}
    for p in (path, old):
        capsys.readouterr()
        assert cli.main(["describe", str(p)]) == 0
        rows[p] = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| url |"))
    assert f"{new_url.distinct:,} (±2.0%)" in rows[path] and f"{new_url.distinct:,} (approx.)" in rows[old]
    for a, b in ((path, old), (old, path)):  # the same statistics either way: no drift
        assert cli.main(["compare", str(a), str(b)]) == 0, capsys.readouterr().out
    merged = statistics.merge([ingest.load_info(str(p)).statistics for p in (path, old)]).feature("url")
    assert not merged.distinct_exact and merged.distinct_error is None  # a merge proves no bound
    assert merged.count == 2 * new_url.count
