"""beam_jobs.WriteDataset: a PCollection of rows -> the dataset `python -m beam_jobs.convert` writes."""

from __future__ import annotations

import collections
import json
import os
import re

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

import ingest
from beam_jobs import WriteDataset
from beam_jobs.convert import ConversionError
from tests.conftest import convert_table, quarantine_lines, read_examples


def _write(rows, out, **kwargs) -> ingest.DatasetInfo:
    with TestPipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), **kwargs)
    return ingest.load_info(str(out))


def _by_id(out, split="train") -> dict:
    return {r["id"][0]: r for r in read_examples(out, split)}


def test_dict_rows_become_a_dataset_the_runtime_reads(tmp):
    rows = [
        {"id": i, "x": i * 0.5, "name": f"n{i}", "blob": bytes([i % 256]), "tags": [i, i + 1], "y": i % 3}
        for i in range(500)
    ]
    rows[7]["x"] = None  # a missing value stays missing
    info = _write(rows, tmp / "ds", label="y", columns=["id", "x"], splits={"train": 0.8, "eval": 0.2}, seed=1)
    features = {f.name: (f.dtype, f.shape, f.text) for f in info.features}
    assert features == {
        "id": ("int64", (), False),
        "x": ("float32", (), False),
        "blob": ("bytes", (), False),
        "name": ("bytes", (), True),
        "tags": ("int64", (None,), False),
        "y": ("int64", (), False),
    }
    assert [f.name for f in info.features] == ["id", "x", "name", "blob", "tags", "y"]  # given, then the rows' order
    assert info.split("train").records + info.split("eval").records == 500 and info.quarantine["records"] == 0
    got = {**_by_id(tmp / "ds"), **_by_id(tmp / "ds", "eval")}
    assert "x" not in got[7] and got[8]["x"] == [4.0] and got[9]["tags"] == [9, 10] and got[9]["name"] == [b"n9"]
    batch = next(iter(ingest.make_dataset(str(tmp / "ds"), batch_size=50, split="train", num_epochs=1)))
    assert batch[0]["id"].shape == (50,) and batch[1].shape == (50,)


def test_record_batches_give_the_dataset_the_cli_writes_from_parquet(tmp):
    table = pa.table(
        {
            "id": pa.array(range(300), pa.int64()),
            "v": pa.array(np.linspace(0, 1, 300), pa.float64()),
            "s": pa.array([f"s{i}" for i in range(300)]),
            "l": pa.array([[i] * (i % 3) for i in range(300)], pa.list_(pa.int32())),
        }
    )
    cli = convert_table(tmp / "cli", table, "--no_shuffle")
    info = _write(table.to_batches(max_chunksize=64), tmp / "ds", shuffle=False)
    cli_info = ingest.load_info(cli)
    assert [(f.name, f.dtype, f.shape, f.text) for f in info.features] == [
        (f.name, f.dtype, f.shape, f.text) for f in cli_info.features
    ]
    assert _records(tmp / "ds") == _records(cli)


def _records(out) -> list:
    return sorted(repr(sorted(r.items())) for r in read_examples(out))


def test_a_few_stray_values_are_quarantined_and_a_mixed_column_is_an_error(tmp):
    rows = [{"id": i, "v": i} for i in range(2000)]
    rows[5]["v"] = "oops"
    info = _write(rows, tmp / "ds", max_bad_fraction=0.01)
    assert {f.name: f.dtype for f in info.features}["v"] == "int64"
    assert info.quarantine["records"] == 1 and info.quarantine["reasons"] == {"type": 1}
    [bad] = quarantine_lines(tmp / "ds")
    assert "'oops' is text, but the column holds int64" in bad["reason"] and '"v": "oops"' in bad["raw"]
    mixed = [{"id": i, "v": i if i % 2 else str(i)} for i in range(100)]
    with pytest.raises(Exception, match=r"column 'v' holds values of several kinds \(int64: 50, text: 50\)"):
        _write(mixed, tmp / "mixed")
    # The failed pipeline's temp dir does not block the next one in this process.
    again = _write([{"id": 1, "v": 1}], tmp / "mixed")
    shard = again.split("train").shards[0]
    assert sorted(os.listdir(tmp / "mixed")) == sorted(["dataset_info.json", shard.filename, shard.index])


def test_ints_and_floats_share_float32_only_when_it_keeps_every_int(tmp):
    small = [{"id": i, "v": i if i % 2 else i + 0.5} for i in range(100)]
    info = _write(small, tmp / "small")
    assert {f.name: f.dtype for f in info.features}["v"] == "float32"
    assert sorted(r["v"][0] for r in read_examples(tmp / "small")) == sorted(float(r["v"]) for r in small)
    ids = [{"id": i, "v": 10**18 + i} for i in range(1000)] + [{"id": 1000, "v": 0.5}]
    info = _write(ids, tmp / "ids", max_bad_fraction=0.01)
    assert {f.name: f.dtype for f in info.features}["v"] == "int64"  # not float32, which would merge them
    assert len({r["v"][0] for r in read_examples(tmp / "ids")}) == 1000 and info.quarantine["records"] == 1


def test_values_beyond_the_stored_type_are_quarantined_not_bent(tmp):
    rows = [{"id": i, "big": 1, "f": 1.0} for i in range(1000)]
    rows[1]["big"] = 2**64
    rows[2]["f"] = 1e300
    info = _write(rows, tmp / "ds", max_bad_fraction=0.01)
    assert info.quarantine["records"] == 2
    reasons = sorted(b["reason"] for b in quarantine_lines(tmp / "ds"))
    assert "beyond int64's range" in reasons[0] + reasons[1] and "float32" in reasons[0] + reasons[1]


def test_a_list_mixing_ints_and_floats_keeps_every_int_or_is_quarantined(tmp):
    rows = [{"id": i, "v": [i, 0.5]} for i in range(300)]
    rows[3]["v"] = [16777217, 0.5]  # 2**24 + 1: float32 would store 16777216.0
    rows[4]["v"] = (np.int64(2**40 + 1), 1.5)
    info = _write(rows, tmp / "ds", max_bad_fraction=0.01)
    assert {f.name: (f.dtype, f.shape) for f in info.features}["v"] == ("float32", (None,))
    assert info.quarantine["records"] == 2
    reasons = sorted(b["reason"] for b in quarantine_lines(tmp / "ds"))
    assert re.search(r"16777217 is not exact in float32", reasons[1]) and "1099511627777" in reasons[0]
    stored = {r["id"][0]: r["v"] for r in read_examples(tmp / "ds")}
    assert 3 not in stored and 4 not in stored and stored[299] == [299.0, 0.5]
    # Lists whose ints float32 cannot hold: int64 for the ints, the floats' rows quarantined.
    big = [{"id": i, "v": [2**40 + i, 7]} for i in range(300)] + [{"id": 300, "v": [0.5, 1]}]
    info = _write(big, tmp / "big", max_bad_fraction=0.01)
    assert {f.name: f.dtype for f in info.features}["v"] == "int64" and info.quarantine["records"] == 1
    assert {r["id"][0]: r["v"] for r in read_examples(tmp / "big")}[5] == [2**40 + 5, 7]


def test_a_list_mixing_str_and_bytes_is_stored_as_bytes_with_str_as_utf8(tmp):
    # Refused as "unsupported list of bytes/bytes": both kinds are bytes features.
    rows = [{"id": 1, "tags": ["é", b"\xff\x00"]}, {"id": 2, "tags": [b"a", "b"]}, {"id": 3, "tags": ["c"]}]
    info = _write(rows, tmp / "ds")
    feature = info.feature("tags")
    assert (feature.dtype, feature.shape, feature.text) == ("bytes", (None,), False)
    stored = {r["id"][0]: r["tags"] for r in read_examples(tmp / "ds")}
    assert stored == {1: ["é".encode(), b"\xff\x00"], 2: [b"a", b"b"], 3: [b"c"]}


def test_bools_are_stored_as_int64_from_dicts_and_record_batches(tmp):
    rows = [
        {"id": i, "flag": i % 2 == 0, "flags": [True, bool(i % 3)], "np_flag": np.bool_(i % 5 == 0), "x": 0.5}
        for i in range(100)
    ]
    rows[7]["x"] = True  # a bool among floats: 1.0
    info = _write(rows, tmp / "dicts")
    assert {f.name: (f.dtype, f.shape) for f in info.features} == {
        "id": ("int64", ()),
        "flag": ("int64", ()),
        "flags": ("int64", (None,)),
        "np_flag": ("int64", ()),
        "x": ("float32", ()),
    }
    got = {r["id"][0]: r for r in read_examples(tmp / "dicts")}
    assert got[4]["flag"] == [1] and got[5]["flag"] == [0] and got[4]["flags"] == [1, 1] and got[3]["flags"] == [1, 0]
    assert got[10]["np_flag"] == [1] and got[11]["np_flag"] == [0] and got[7]["x"] == [1.0]
    batch = pa.record_batch({"id": pa.array(range(4)), "flag": pa.array([True, False, None, True])})
    info = _write([batch], tmp / "batches")
    assert {f.name: f.dtype for f in info.features}["flag"] == "int64"
    assert {r["id"][0]: r.get("flag") for r in read_examples(tmp / "batches")} == {0: [1], 1: [0], 2: None, 3: [1]}


def test_beam_rows_missing_labels_and_label_checks(tmp):
    rows = [beam.Row(id=i, y=None if i == 3 else i % 2) for i in range(200)]
    info = _write(rows, tmp / "ds", label="y", max_bad_fraction=0.01)
    assert info.quarantine["reasons"] == {"missing_label": 1} and info.split("train").records == 199
    with pytest.raises(Exception, match=r"the label column 'nope' is not among the columns: \['id', 'y'\]"):
        _write([{"id": 1, "y": 0}], tmp / "nolabel", label="nope")


def test_the_output_directory_rules_hold(tmp):
    _write([{"id": 1}], tmp / "ds")
    with pytest.raises(Exception, match=r"already holds a dataset .*overwrite"):  # refused as it runs
        _write([{"id": 2}], tmp / "ds")
    info = _write([{"id": 2}], tmp / "ds", overwrite=True)
    assert [r["id"] for r in read_examples(tmp / "ds")] == [[2]] and info.split("train").records == 1
    shard = info.split("train").shards[0]
    assert sorted(os.listdir(tmp / "ds")) == sorted(["dataset_info.json", shard.filename, shard.index])
    with pytest.raises(ConversionError, match=r"--max_bad_fraction must be in \[0, 1\]"):
        WriteDataset(str(tmp / "x"), max_bad_fraction=2)


def test_the_output_is_claimed_when_the_pipeline_runs_not_when_it_is_built(tmp):
    p = beam.Pipeline()
    _ = p | beam.Create([{"id": 1}]) | WriteDataset(str(tmp / "ds"))
    assert not os.path.exists(tmp / "ds")  # built, not run: nothing claimed
    p.run().wait_until_finish()
    shard = "train-00000-of-00001.tfrecord"
    assert sorted(os.listdir(tmp / "ds")) == sorted(["dataset_info.json", shard, shard + ".index"])


def test_windowed_rows_are_written_as_one_dataset(tmp):
    with TestPipeline() as p:
        _ = (
            p
            | beam.Create([{"id": i, "x": i * 0.5} for i in range(300)])
            | beam.Map(lambda r: beam.window.TimestampedValue(r, r["id"]))
            | beam.WindowInto(beam.window.FixedWindows(10))
            | WriteDataset(str(tmp / "ds"))
        )
    assert sorted(r["id"][0] for r in read_examples(tmp / "ds")) == list(range(300))


def test_two_writers_into_one_output_are_refused_when_built(tmp):
    p = beam.Pipeline()
    rows = p | beam.Create([{"id": 1}])
    _ = rows | "A" >> WriteDataset(str(tmp / "ds"))
    with pytest.raises(ConversionError, match=r"already has a WriteDataset into .*ds: .*an output of its own"):
        _ = rows | "B" >> WriteDataset(str(tmp / "ds/"))
    _ = rows | "C" >> WriteDataset(str(tmp / "other"))  # another output is fine


@pytest.mark.slow
def test_shard_counts_are_planned_from_the_data_or_given(tmp, monkeypatch):
    from beam_jobs.output import shard_plan

    monkeypatch.setattr(shard_plan, "MIN_SHARD_MB", 0.01)  # a test-sized corpus, planned like a large one
    rows = [{"id": i, "text": "x" * 200} for i in range(3000)]
    planned = _write(rows, tmp / "planned", target_shard_mb=0.1)
    assert 4 <= len(planned.split("train").shards) <= 10  # ~0.7 MB in 0.1 MB shards
    given = _write(rows, tmp / "given", num_shards=3)
    assert len(given.split("train").shards) == 3 and given.options["num_shards"] == {"train": 3}


def test_batches_whose_column_types_differ_are_read_value_by_value(tmp):
    good = pa.record_batch({"id": pa.array(range(500), pa.int64()), "v": pa.array(range(500), pa.int64())})
    odd = pa.record_batch({"id": pa.array([500], pa.int64()), "v": pa.array(["x"])})
    info = _write([good, odd], tmp / "ds", max_bad_fraction=0.01)
    assert {f.name: f.dtype for f in info.features}["v"] == "int64" and info.quarantine["records"] == 1
    assert sorted(r["id"][0] for r in read_examples(tmp / "ds")) == list(range(500))


@pytest.mark.slow
def test_the_multi_process_runner_writes_the_same_records(tmp):
    from apache_beam.options.pipeline_options import PipelineOptions

    rows = [{"id": i, "name": f"n{i}"} for i in range(3000)]
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with TestPipeline(options=options) as p:
        _ = p | beam.Create(rows) | WriteDataset(str(tmp / "ds"), num_shards=2)
    assert sorted(r["id"][0] for r in read_examples(tmp / "ds")) == list(range(3000))


def test_an_empty_pcollection_is_refused_not_written(tmp):
    # Nothing reaches the global merges: the finalize step gets the merge of nothing and
    # refuses, naming the input, instead of writing an empty dataset.
    with pytest.raises(Exception, match=r"no records were read from WriteDataset input .*refusing to write an empty"):
        _write([], tmp / "ds")
    assert not os.path.exists(tmp / "ds" / "dataset_info.json")


def test_a_none_inside_a_list_quarantines_its_row_naming_the_column(tmp):
    # As a null element of a Parquet list. The reason was "[7, None] is not a list" (and a column of
    # such rows failed the job as 'unsupported list of None/int64').
    rows = [{"id": i, "v": [i, i + 1], "s": ["a"]} for i in range(200)]
    rows[7]["v"] = [7, None]
    rows[9]["s"] = [None]
    info = _write(rows, tmp / "ds", max_bad_fraction=0.05)
    assert {f.name: (f.dtype, f.shape) for f in info.features} == {
        "id": ("int64", ()),
        "v": ("int64", (None,)),
        "s": ("bytes", (None,)),
    }
    reasons = {json.loads(b["raw"])["id"]: b["reason"] for b in quarantine_lines(tmp / "ds")}
    assert re.search(r"^column 'v': element 2 of its list is None.*must not contain null", reasons[7])
    assert re.search(r"^column 's': element 1 of its list is None", reasons[9]) and len(reasons) == 2
    assert sorted(_by_id(tmp / "ds")) == [i for i in range(200) if i not in (7, 9)]


class _Row(collections.UserDict):
    """A row Beam's coder pickles: a dict holding a str with a lone surrogate fails Beam's own
    coder wherever it encodes or samples a step's output (the first 10 elements of each),
    before WriteDataset sees it; rows reach WriteDataset so from any step Beam did not sample."""


def test_a_str_with_a_lone_surrogate_is_quarantined_not_a_pipeline_failure(tmp):
    # It failed the pipeline: Beam's coder could not encode WriteDataset's batches of rows.
    rows = [_Row({"id": i, "name": f"n{i}", "tags": ["a", "b"]}) for i in range(20)]
    rows[3]["name"] = b"caf\xe9".decode("utf-8", "surrogateescape")  # 'caf\udce9'
    rows[7]["tags"] = ["a", "b\ud800"]
    info = _write(rows, tmp / "ds", max_bad_fraction=0.2)
    bad = sorted(quarantine_lines(tmp / "ds"), key=lambda q: q["reason"])
    assert [q["kind"] for q in bad] == ["utf8", "utf8"] and info.quarantine["records"] == 2
    assert re.search(
        r"column 'name': 'caf\\udce9' holds the lone surrogate U\+DCE9 at position 3.*bytes", bad[0]["reason"]
    )
    assert "column 'tags'" in bad[1]["reason"] and "U+D800" in bad[1]["reason"]
    assert sorted(r["id"][0] for r in read_examples(tmp / "ds")) == [i for i in range(20) if i not in (3, 7)]
    assert sorted(ingest.load_info(str(tmp / "ds")).vocabulary("name")) == sorted(
        f"n{i}" for i in range(20) if i not in (3, 7)
    )
