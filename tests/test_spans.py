"""Spans read as one: a list, a glob or `ingest.spans(root, last=N)` of converted datasets.

The spans are months of real data (Seattle's daily weather, vega_datasets), each
converted on its own as a daily pipeline would; every row carries its date, a unique id.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
import tensorflow as tf

import ingest
from tests.conftest import convert_table, real_csv, run_convert

MONTHS = ("2012-01", "2012-02", "2012-03", "2012-04")
BATCH = 8


def _weather() -> pa.Table:
    return pcsv.read_csv(real_csv("seattle-weather.csv"))


def _month(table: pa.Table, month: str) -> pa.Table:
    dates = np.array(table.column("date").to_pylist())
    return table.take(np.flatnonzero(np.char.startswith(dates, month.replace("-", "/"))))


@pytest.fixture(scope="module", params=["blocks", "rows"])
def months(tmp_path_factory, request):
    """root/spans/<month>: four months converted one by one (blocks of 4 rows), and their rows."""
    root = tmp_path_factory.mktemp("spans")
    weather = _weather()
    for month in MONTHS:
        os.makedirs(root / "in", exist_ok=True)
        pcsv.write_csv(_month(weather, month), str(root / "in" / f"{month}.csv"))
        run_convert(
            "--source", "csv", "--input", root / "in" / f"{month}.csv", "--output", root / "spans" / month,
            "--label", "weather", "--layout", request.param, "--num_shards", "2",
            *(["--block_rows", "4"] if request.param == "blocks" else []),
        )  # fmt: skip
    return root / "spans", {m: _month(weather, m).column("date").to_pylist() for m in MONTHS}


def _dates(ds) -> list:
    return [d.decode() for batch in ds for d in batch["date"].numpy().tolist()]


def _read(path, **kwargs) -> tf.data.Dataset:
    return ingest.make_dataset(path, batch_size=BATCH, label=False, seed=5, **kwargs)


def test_spans_are_the_latest_finished_directories_by_name(months, caplog):
    root, _ = months
    os.makedirs(root / "2012-05" / "_ingest_tmp-job")  # today's span, still converting
    try:
        with caplog.at_level(logging.WARNING):
            assert ingest.spans(root, last=2) == [f"{root}/2012-03", f"{root}/2012-04"]
        assert "2012-05" in caplog.text
        assert ingest.spans(str(root) + "/") == [f"{root}/{m}" for m in MONTHS]
        assert ingest.spans(root, last=10) == [f"{root}/{m}" for m in MONTHS]
    finally:
        os.rmdir(root / "2012-05" / "_ingest_tmp-job")
        os.rmdir(root / "2012-05")
    with pytest.raises(ValueError, match="last must be a positive integer"):
        ingest.spans(root, last=0)
    with pytest.raises(FileNotFoundError, match="directory does not exist"):
        ingest.spans(root / "nope")
    with pytest.raises(FileNotFoundError, match="no converted dataset under"):
        ingest.spans(root / "2012-01")  # a dataset, not a directory of spans


def _listed_spans(root, names) -> None:
    """Directories that spans() lists: each holds a metadata file naming its conversion."""
    for name in names:
        os.makedirs(root / name)
        (root / name / "dataset_info.json").write_text(json.dumps({"source": {"job": f"job-{name}"}}))


def test_spans_are_ordered_by_the_date_in_their_names_else_by_name(tmp_path, caplog):
    """By name, 2026-11-28 came before 2026-11-3 and 20261127, and backfill-... last of all."""
    from ingest.metadata._spans import date_in

    dated = tmp_path / "dated"
    _listed_spans(dated, ["2026-11-3", "20261127", "backfill-2026-11-20", "2026-11-28", "2026_11_29"])
    assert [p.rsplit("/", 1)[1] for p in ingest.spans(dated)] == [
        "2026-11-3", "backfill-2026-11-20", "20261127", "2026-11-28", "2026_11_29",
    ]  # fmt: skip
    assert ingest.spans(dated, last=2) == [f"{dated}/2026-11-28", f"{dated}/2026_11_29"]
    assert [date_in(n) for n in ("2012-03", "run-20261127-2026-11-28", "12345678", "2026-13-01", "v2")] == [
        (2012, 3, 0), (2026, 11, 28), None, None, None,
    ]  # fmt: skip
    mixed = tmp_path / "mixed"
    _listed_spans(mixed, ["2026-11-28", "b", "a"])
    with caplog.at_level(logging.WARNING):
        assert ingest.spans(mixed) == [f"{mixed}/2026-11-28", f"{mixed}/a", f"{mixed}/b"]
    assert re.search(r"ordered by name, not by date: .*/a, .*/b have no date", caplog.text)


def test_every_row_of_every_span_once_per_epoch_shuffled_across_spans(months):
    root, rows = months
    paths = ingest.spans(root, last=3)
    expected = sorted(d for m in MONTHS[1:] for d in rows[m])
    ds = _read(paths, num_epochs=2)
    assert ds.cardinality().numpy() == -(-2 * len(expected) // BATCH)
    dates = _dates(ds)
    assert sorted(dates[: len(expected)]) == expected and sorted(dates[len(expected) :]) == expected
    first = dates[: 4 * BATCH]
    assert len({d[:7] for d in first}) >= 2, f"the first batches hold one span only: {first}"
    assert dates[: len(expected)] != sorted(dates[: len(expected)])


def test_a_glob_reads_what_the_list_reads(months):
    root, rows = months
    by_glob = _read(f"{root}/2012-0[2-4]")
    by_list = _read([f"{root}/2012-02", f"{root}/2012-03", f"{root}/2012-04"])
    assert _dates(by_glob) == _dates(by_list)
    with pytest.raises(FileNotFoundError, match=r"no converted dataset matches .*2013-\*"):
        _read(f"{root}/2013-*")
    with pytest.raises(ValueError, match="name the same dataset more than once"):
        _read([f"{root}/2012-02", f"{root}/2012-0[2-3]"])


@pytest.mark.slow
def test_spans_resume_exactly_and_seek(months, tmp_path):
    root, _ = months
    paths = ingest.spans(root)
    whole = _dates(_read(paths, num_epochs=None).take(30))
    it = iter(_read(paths, num_epochs=None))
    for _ in range(7):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    again = iter(_read(paths, num_epochs=None))
    tf.train.Checkpoint(iterator=again).read(prefix)
    assert [d.decode() for _ in range(23) for d in next(again)["date"].numpy().tolist()] == whole[7 * BATCH :]
    if ingest.load_info(paths).layout == "blocks":
        assert _dates(_read(paths, num_epochs=None, start_batch=7).take(23)) == whole[7 * BATCH :]


def test_a_checkpoint_of_other_spans_is_refused(tmp_path):
    # The seekable order (blocks) fingerprints what it reads; the rows layout's checkpoints
    # are tf.data's own, which carry no fingerprint: blocks spans, made here.
    weather = _weather()
    a, b, c = (convert_table(tmp_path / m, _month(weather, m), "--block_rows", "4") for m in MONTHS[:3])
    it = iter(_read([a, b], num_epochs=None))
    next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    other = iter(_read([a, c], num_epochs=None))
    with pytest.raises(tf.errors.InvalidArgumentError, match="restored from a checkpoint of another dataset"):
        tf.train.Checkpoint(iterator=other).read(prefix)
        next(other)


def test_input_pipelines_split_the_spans_rows(months):
    root, rows = months
    paths = ingest.spans(root)
    parts = [_dates(_read(paths, input_context=tf.distribute.InputContext(2, i, 1), shuffle=False)) for i in range(2)]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(d for m in MONTHS for d in rows[m])


def test_statistics_of_spans_are_those_of_their_rows_converted_together(months, tmp_path):
    root, rows = months
    together = convert_table(tmp_path, pa.concat_tables([_month(_weather(), m) for m in MONTHS]), "--label", "weather")
    merged = ingest.load_info(ingest.spans(root)).statistics
    whole = ingest.load_info(together).statistics
    for name in ("precipitation", "temp_max", "wind"):
        m, w = merged.overall[name], whole.overall[name]
        assert (m.count, m.missing, m.min, m.max, m.zeros) == (w.count, w.missing, w.min, w.max, w.zeros), name
        assert m.mean == pytest.approx(w.mean, rel=1e-6) and m.std == pytest.approx(w.std, rel=1e-6), name
        values = np.sort(np.concatenate([_month(_weather(), mo).column(name).to_numpy() for mo in MONTHS]))
        values, quantiles = values.astype(np.float32), np.asarray(m.quantiles[1:-1], np.float32)  # as stored
        # Each percentile's rank within 2 points; many values repeat (rounded to 0.1): any rank of a tie.
        low = np.searchsorted(values, quantiles, side="left") / len(values)
        high = np.searchsorted(values, quantiles, side="right") / len(values)
        target = np.linspace(0, 1, 101)[1:-1]
        assert np.all((low - 0.02 <= target) & (target <= high + 0.02)), name
    label, label_whole = merged.overall["weather"], whole.overall["weather"]
    assert label.top == label_whole.top and label.top_exact and label.distinct == label_whole.distinct
    assert merged.splits["train"]["wind"].count == sum(
        ingest.load_info(f"{root}/{m}").statistics.splits["train"]["wind"].count for m in MONTHS
    )
    space = ingest.feature_space(ingest.spans(root), features={"temp_max": "float_normalized"})
    x = space({"temp_max": tf.constant([whole.overall["temp_max"].mean])})
    assert abs(float(tf.reshape(x, [-1])[0])) < 1e-3  # normalized by the merged mean


def test_spans_whose_features_disagree_are_refused_naming_them(tmp_path):
    a = convert_table(tmp_path / "a", pa.table({"x": [1, 2, 3], "y": [1.0, 2.0, 3.0]}))
    b = convert_table(tmp_path / "b", pa.table({"x": [1.5, 2.0, 3.0], "y": [1.0, 2.0, 3.0]}))
    c = convert_table(tmp_path / "c", pa.table({"x": [1, 2, 3], "z": [1.0, 2.0, 3.0]}))
    disagree = r"feature 'x' is float32 scalar.* in .*b/ds but int64 scalar.* in .*a/ds.*--schema_from"
    with pytest.raises(ValueError, match=disagree):
        ingest.make_dataset([a, b], batch_size=2)
    other = r"different features: .*c/ds has \['z'\] that .*a/ds has not; .*c/ds lacks \['y'\]"
    with pytest.raises(ValueError, match=other):
        ingest.load_info([a, c])


def test_class_ids_of_spans_whose_label_classes_differ_are_refused(months, tmp_path):
    root, _ = months
    like = ingest.load_info(f"{root}/2012-01")
    layout = ["--layout", like.layout] + (["--block_rows", str(like.block_rows)] if like.block_rows else [])
    may = convert_table(tmp_path, _month(_weather(), "2012-05"), "--label", "weather", *layout)  # no snow in May
    paths = [f"{root}/2012-01", may]
    with pytest.raises(ValueError, match=r"label 'weather' has other classes .*--schema_from.*label_ids=False"):
        ingest.make_dataset(paths, batch_size=BATCH)
    labels = [y for _, y in ingest.make_dataset(paths, batch_size=BATCH, label_ids=False)]
    assert {v for y in labels for v in y.numpy().tolist()} >= {b"rain", b"snow"}


@pytest.mark.slow
def test_spans_feed_a_mirrored_strategy_every_row_once(months):
    root, rows = months
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = ingest.distribute(strategy, ingest.spans(root), global_batch_size=16, label=False, shuffle=False)
    seen = [
        d.decode()
        for batch in ds
        for part in strategy.experimental_local_results(batch["date"])
        for d in part.numpy().tolist()
    ]
    assert sorted(seen) == sorted(d for m in MONTHS for d in rows[m])


def test_one_span_spelt_two_ways_is_refused(months, monkeypatch):
    root, _ = months
    monkeypatch.chdir(root)
    for twice in (["./2012-01", "2012-01"], ["2012-01", f"{root}/2012-01"], ["2012-01", "2012-02/../2012-01"]):
        with pytest.raises(ValueError, match="name the same dataset more than once"):
            ingest.make_dataset(twice, batch_size=BATCH)
    with pytest.raises(ValueError, match="name the same dataset more than once"):
        ingest.make_dataset(["2012-0[12]", "2012-01"], batch_size=BATCH)


def test_a_link_to_a_span_or_a_copy_of_one_is_read_once_as_that_span(months, tmp_path, caplog):
    src, rows = months
    root = tmp_path / "spans"
    for month in MONTHS:
        shutil.copytree(src / month, root / month)
    os.symlink(root / "2012-04", root / "latest")  # sorts last: it would be "the latest span"
    shutil.copytree(root / "2012-04", root / "2012-04-rerun")  # a copy: same conversion, other directory
    shutil.copytree(root / "2012-02", root / "2012-02-backup")
    with caplog.at_level(logging.WARNING):
        assert ingest.spans(root, last=2) == [f"{root}/2012-03", f"{root}/2012-04"]
    assert re.search(r"latest \(a link to .*2012-04\).*2012-04-rerun \(a copy of .*2012-04: both", caplog.text)
    assert ingest.spans(root) == [f"{root}/{m}" for m in MONTHS]
    expected = sorted(rows["2012-03"] + rows["2012-04"])
    assert sorted(_dates(_read(ingest.spans(root, last=2)))) == expected
    # Named explicitly, or matched by a glob, one dataset twice is refused, whatever its name.
    for twice, how in (
        ([f"{root}/2012-04", f"{root}/latest"], r"both lead to .*2012-04"),
        ([f"{root}/2012-04", f"{root}/2012-04-rerun"], r"both were written by conversion \S+"),
        (f"{root}/2012-02*", r"both were written by conversion \S+"),
    ):
        with pytest.raises(ValueError, match=rf"are the same dataset \({how}\): its rows would be read twice"):
            _read(twice)
        with pytest.raises(ValueError, match="are the same dataset"):
            ingest.load_info(twice)  # its statistics would count the rows twice


def test_a_span_without_the_split_is_named_not_left_out(months, tmp_path):
    root, _ = months
    like = ingest.load_info(f"{root}/2012-01")
    layout = ["--layout", like.layout] + (["--block_rows", str(like.block_rows)] if like.block_rows else [])
    split = convert_table(
        tmp_path, _month(_weather(), "2012-01"), "--label", "weather", "--splits", "train=0.5,eval=0.5", *layout
    )
    with pytest.raises(ValueError, match=rf"split 'eval' is missing from 1 of .*: {re.escape(str(root))}/2012-02;"):
        ingest.make_dataset([split, f"{root}/2012-02"], batch_size=BATCH, split="eval")


def test_spans_with_and_without_a_label_differ_in_label(tmp_path):
    table = pa.table({"x": [1.0, 2.0], "lab": ["a", "b"]})
    plain, labelled = convert_table(tmp_path / "a", table), convert_table(tmp_path / "b", table, "--label", "lab")
    with pytest.raises(ValueError, match=r"differ in label: None and 'lab'"):
        ingest.load_info([plain, labelled])
    with pytest.raises(FileNotFoundError, match="is a file, not a directory of spans"):
        ingest.spans(f"{plain}/dataset_info.json")


def _as_format_2(path) -> None:
    """Rewrites a blocks dataset as format_version 2 wrote it: bytes columns as plain lists
    (no `F/codes`), and no block indexes."""
    meta_path = os.path.join(path, "dataset_info.json")
    with open(meta_path) as f:
        meta = json.load(f)
    text = [f["name"] for f in meta["features"] if f["dtype"] == "bytes"]
    for split in meta["splits"]:
        for shard in split["shards"]:
            file = os.path.join(path, shard["filename"])
            blocks = []
            for raw in tf.data.TFRecordDataset(file).as_numpy_iterator():
                example = tf.train.Example.FromString(raw)
                features = example.features.feature
                for name in text:
                    dictionary = list(features[name].bytes_list.value)
                    # A block of distinct values has no codes (format 4): its dictionary in order.
                    codes = features.pop(name + "/codes").int64_list.value if name + "/codes" in features else None
                    values = dictionary if codes is None else [dictionary[c] for c in codes]
                    features.pop(name + "/ids", None)
                    del features[name].bytes_list.value[:]
                    features[name].bytes_list.value.extend(values)
                blocks.append(example.SerializeToString())
            with tf.io.TFRecordWriter(file) as writer:
                for block in blocks:
                    writer.write(block)
            shard["bytes"] = os.path.getsize(file)
            shard.pop("fingerprint", None)  # recorded since format 4
            os.remove(os.path.join(path, shard.pop("index")))
        split["bytes"] = sum(shard["bytes"] for shard in split["shards"])
    meta["format_version"] = 2
    meta.pop("vocabularies", None)  # format 4 added them
    with open(meta_path, "w") as f:
        json.dump(meta, f)


@pytest.mark.slow
def test_spans_converted_before_and_after_dictionaries_read_as_one(tmp_path):
    """A daily retraining's spans span an upgrade: format 2 and 3 blocks meet in one window."""
    from ingest.metadata import _facts

    weather = _weather()
    old, new = (convert_table(tmp_path / m, _month(weather, m), "--block_rows", "4") for m in MONTHS[:2])
    before = _dates(_read(old, shuffle=False))
    _as_format_2(old)
    assert ingest.load_info(old).format_version == 2 and ingest.load_info(new).format_version == 4
    assert _dates(_read(old, shuffle=False)) == before
    infos = [ingest.load_info(p) for p in (old, new)]
    assert _facts.text_codes(infos) is None and _facts.text_codes(infos[1:]) is None  # format 4: each block says
    expected = sorted(before + _dates(_read(new, shuffle=False)))
    for options in ({"shuffle": False}, {}, {"options": ingest.ReadOptions(seekable_order=False)}):
        dates = _dates(_read([old, new], **options))
        assert sorted(dates) == expected, options
    weathers = [w.decode() for batch in _read([old, new], shuffle=False) for w in batch["weather"].numpy().tolist()]
    assert sorted(weathers) == sorted(_month(weather, MONTHS[0]).column("weather").to_pylist()
                                      + _month(weather, MONTHS[1]).column("weather").to_pylist())  # fmt: skip
