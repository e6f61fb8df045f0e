"""CSV -> TFRecord conversion with real Beam pipelines and real files."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from beam_jobs import convert
from beam_jobs.convert import ConversionError
from ingest import contract
from tests.conftest import quarantine_lines, read_examples, read_shard, run_convert, write_text

CSV = (
    "id,age,score,name,city\n"
    "1,34,1.5,ann,paris\n"
    "2,,2.0,bob,NA\n"
    '3,29,3,"smith, carl",null\n'
    '4,41,NA,dora,"new\nyork"\n'
    '5,38,-0.25,,"x"\n'
)


def _by_id(rows):
    return {r["id"][0]: r for r in rows}


def test_csv_round_trip_infers_types_and_keeps_missing_values_missing(tmp):
    src = write_text(tmp / "in" / "a.csv", CSV)
    info = run_convert(
        "--source", "csv", "--input", src, "--output", tmp / "out", "--allow_quoted_newlines"
    )  # "new\nyork"
    types = {f.name: f.dtype for f in info.features}
    # age has an empty cell but is int; score mixes ints and floats, so it widens to float.
    assert types == {"id": "int64", "age": "int64", "score": "float32", "name": "bytes", "city": "bytes"}
    rows = _by_id(read_examples(tmp / "out"))
    assert set(rows) == {1, 2, 3, 4, 5}
    assert rows[1] == {"id": [1], "age": [34], "score": [1.5], "name": [b"ann"], "city": [b"paris"]}
    assert "age" not in rows[2] and "city" not in rows[2]  # empty cell and NA: missing, not 0 or "NA"
    assert rows[3]["name"] == [b"smith, carl"] and "city" not in rows[3]
    assert rows[4]["city"] == [b"new\nyork"] and "score" not in rows[4]
    assert "name" not in rows[5] and rows[5]["score"] == [-0.25]
    missing = {f.name: f.missing for f in info.features}
    assert missing == {"id": 0, "age": 1, "score": 1, "name": 1, "city": 2}


def test_crlf_bom_and_gzip_inputs_read_like_plain_csv(tmp):
    plain = write_text(tmp / "plain" / "a.csv", CSV)
    run_convert("--source", "csv", "--input", plain, "--output", tmp / "o1", "--allow_quoted_newlines")  # "new\nyork"
    quirky = tmp / "quirky"
    os.makedirs(quirky)
    data = ("\ufeff" + CSV.replace("\n", "\r\n").replace("new\r\nyork", "new\nyork")).encode("utf-8")
    with gzip.open(quirky / "a.csv.gz", "wb") as f:
        f.write(data)
    info = run_convert(
        "--source", "csv", "--input", quirky / "a.csv.gz", "--output", tmp / "o2", "--allow_quoted_newlines"
    )
    assert [f.name for f in info.features] == ["id", "age", "score", "name", "city"]
    assert _by_id(read_examples(tmp / "o1")) == _by_id(read_examples(tmp / "o2"))


def test_delimiter_and_custom_null_markers(tmp):
    src = write_text(tmp / "in" / "a.tsv", "k;v\n1;-\n2;7\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--delimiter", ";", "--null_values", "-")
    rows = {r["k"][0]: r for r in read_examples(tmp / "out")}
    assert "v" not in rows[1] and rows[2]["v"] == [7]


@pytest.mark.parametrize("delimiter, flag", [(";", "';'"), ("\t", "tab"), ("|", "'|'")])
def test_a_header_holding_another_delimiter_is_refused_naming_the_flag(tmp, delimiter, flag):
    # Read with ',' it was one text column named 'a;b;c', every row one cell.
    src = write_text(tmp / "in" / "a.csv", delimiter.join(["a", "b", "c"]) + "\n" + delimiter.join("123") + "\n")
    with pytest.raises(ValueError, match=rf"a\.csv: .*header is one column, .*holds 2 .*pass --delimiter {flag}"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out")
    assert not os.path.exists(tmp / "out")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--delimiter", flag.strip("'"))
    assert [f.name for f in info.features] == ["a", "b", "c"] and read_examples(tmp / "out") == [
        {"a": [1], "b": [2], "c": [3]}
    ]
    # Given explicitly, ',' keeps the one column.
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "one", "--delimiter", ",")
    assert [f.name for f in info.features] == [delimiter.join(["a", "b", "c"])]


def test_a_tab_delimiter_is_accepted_as_backslash_t(tmp):
    src = write_text(tmp / "in" / "a.tsv", "a\tb\n1\t2\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--delimiter", "\\t")
    assert read_examples(tmp / "out") == [{"a": [1], "b": [2]}]


def test_given_schema_and_column_flags_override_inference(tmp):
    src = write_text(tmp / "in" / "a.csv", "zip,n,x\n00123,1,2\n04567,2,3\n")
    schema = write_text(tmp / "schema.json", json.dumps({"columns": {"zip": "string"}}))
    info = run_convert(
        "--source", "csv", "--input", src, "--output", tmp / "out", "--schema", schema, "--column", "n:float32"
    )
    assert {f.name: f.dtype for f in info.features} == {"zip": "bytes", "n": "float32", "x": "int64"}
    assert info.source["schema"] == "mixed"
    rows = read_examples(tmp / "out")
    assert sorted(r["zip"][0] for r in rows) == [b"00123", b"04567"]  # leading zeros kept


def test_unknown_type_in_column_flag_is_a_clear_error(tmp):
    src = write_text(tmp / "in" / "a.csv", "a\n1\n")
    with pytest.raises(
        ValueError, match=r"column 'a': unknown type 'decimal'.*int64, float32, float64 \(or double\), string"
    ):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--column", "a:decimal")


def test_files_with_different_headers_name_the_first_that_differs(tmp):
    write_text(tmp / "in" / "a.csv", "x,y\n1,2\n")
    write_text(tmp / "in" / "b.csv", "x,y\n3,4\n")
    write_text(tmp / "in" / "c.csv", "x,z\n5,6\n")
    write_text(tmp / "in" / "d.csv", "q\n7\n")
    with pytest.raises(ConversionError, match=r"c\.csv has header \['x', 'z'\].*first file .*a\.csv"):
        run_convert("--source", "csv", "--input", tmp / "in" / "*.csv", "--output", tmp / "out")
    assert not os.path.exists(tmp / "out" / "dataset_info.json")


def test_bad_rows_go_to_quarantine_and_good_rows_are_all_written(tmp):
    good = [f"{i},{i * 10},w{i}" for i in range(2000)]
    lines = ["id,n,s"] + good[:700] + ["700,1,2,3"] + good[700:1500] + ["1500,abc,w"] + good[1500:]
    path = tmp / "in" / "a.csv"
    os.makedirs(path.parent)
    body = ("\n".join(lines) + "\n").encode()
    body = body.replace(b"w1999\n", b"w\xff\xfe\n")  # undecodable text in the last good row
    path.write_bytes(body)
    info = run_convert(
        "--source", "csv", "--input", path, "--output", tmp / "out", "--column", "n:int64", "--max_bad_fraction", "0.01"
    )
    rows = read_examples(tmp / "out")
    assert sorted(r["id"][0] for r in rows) == list(range(1999))
    bad = sorted(quarantine_lines(tmp / "out"), key=lambda b: b["row"])
    assert [b["kind"] for b in bad] == ["field_count", "type", "utf8"]
    # Rows count from the header (row 1): good row i sits at row i + 2, shifted by the bad rows above it.
    assert [b["row"] for b in bad] == [702, 1503, 2003]
    assert all(b["source"].endswith("a.csv") for b in bad)
    assert bad[0]["raw"] == "700,1,2,3" and "expected 3 fields, found 4" in bad[0]["reason"]
    assert "'abc' is not a valid int64" in bad[1]["reason"]
    assert "not valid UTF-8" in bad[2]["reason"]
    assert info.quarantine["records"] == 3
    assert info.quarantine["reasons"] == {"field_count": 1, "type": 1, "utf8": 1}
    assert info.source["rows"] == 2002


def test_too_many_bad_rows_fail_the_job_and_write_no_metadata(tmp):
    src = write_text(tmp / "in" / "a.csv", "a,b\n" + "1,2\n" * 50 + "1\n" * 5)
    with pytest.raises(Exception, match=r"5 of 55 rows .* quarantined .*--max_bad_fraction=0.001"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out")
    assert not os.path.exists(tmp / "out" / "dataset_info.json")
    assert not any(n.endswith(".tfrecord") for n in os.listdir(tmp / "out"))


def test_inference_tolerates_a_stray_value_and_quarantines_it(tmp):
    rows = "\n".join(f"{i}" for i in range(5000))
    src = write_text(tmp / "in" / "a.csv", "n\n" + rows + "\noops\n")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out")
    assert info.feature("n").dtype == "int64"
    assert [b["raw"] for b in quarantine_lines(tmp / "out")] == ["oops"]


def test_missing_label_rows_are_quarantined(tmp):
    src = write_text(tmp / "in" / "a.csv", "x,y\n" + "1,0\n" * 2000 + "2,\n")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--label", "y")
    assert info.label == "y" and info.feature("y").role == "label"
    assert info.split("train").records == 2000
    assert [b["kind"] for b in quarantine_lines(tmp / "out")] == ["missing_label"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lable", "a"], r"unknown flag --lable \(did you mean --label\?\)"),
        (["--no_shufle"], r"unknown flag --no_shufle \(did you mean --no_shuffle\?\)"),
        (["--direct_runing_mode=in_memory"], r"unknown flag --direct_runing_mode \(did you mean --direct_running_mode"),
        (["--zzzz"], r"unknown flag --zzzz: it is neither a flag of python -m beam_jobs\.convert .* nor a Beam"),
        (["stray"], r"unexpected argument 'stray'"),
    ],
)
def test_a_flag_that_is_neither_the_jobs_nor_beams_is_refused_before_anything_runs(tmp, argv, message):
    src = write_text(tmp / "a.csv", "a,b\n1,2\n")
    with pytest.raises(ConversionError, match=message):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out", *argv)
    assert not os.path.exists(tmp / "out")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--label", "specis"], r"--label 'specis' \(did you mean 'species'\?\) is not a column of the input"),
        (["--label", "Species"], r"--label 'Species' \(did you mean 'species'\?\) is not a column"),
        (["--columns", "bill_lenght"], r"--columns names \['bill_lenght'\] \(did you mean 'bill_length'\?\), which"),
        (["--split_key", "island_"], r"--split_key 'island_' \(did you mean 'island'\?\) is not a column"),
    ],
)
def test_a_misspelt_column_is_answered_with_the_nearest_name(tmp, argv, message):
    src = write_text(tmp / "a.csv", "species,bill_length,island\nAdelie,39.1,Biscoe\n")
    with pytest.raises(ConversionError, match=message):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out", *argv)
    assert not os.path.exists(tmp / "out")


def test_beam_options_pass_and_the_summary_names_the_label(tmp, capsys):
    src = write_text(tmp / "a.csv", "a,b\n1,2\n3,4\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp / "one", "--label", "b", "--job_name", "t1")
    assert "label: b" in capsys.readouterr().out
    run_convert("--source", "csv", "--input", src, "--output", tmp / "two", "--direct_num_workers", "1")
    assert "label: none" in capsys.readouterr().out


def test_a_directory_as_input_suggests_the_pattern_of_its_files(tmp):
    write_text(tmp / "in" / "a.csv", "a\n1\n")
    with pytest.raises(ConversionError, match=r"matches .*in, a directory; give a pattern .* --input '.*in/\*\.csv'"):
        run_convert("--source", "csv", "--input", tmp / "in", "--output", tmp / "out")
    assert not os.path.exists(tmp / "out")


def test_a_glob_matching_a_dangling_symlink_or_a_directory_is_refused_naming_it(tmp):
    # Beam's listing leaves both out without a word: "converting 1 csv file(s)", exit 0.
    write_text(tmp / "in" / "a.csv", "a\n1\n")
    os.symlink(tmp / "moved" / "b.csv", tmp / "in" / "b.csv")
    with pytest.raises(ConversionError, match=r"matches .*in/b\.csv, a dangling symlink \(to .*moved/b\.csv\)"):
        run_convert("--source", "csv", "--input", tmp / "in" / "*.csv", "--output", tmp / "out")
    with pytest.raises(ConversionError, match=r"matches .*in/b\.csv, a dangling symlink"):
        run_convert("--source", "csv", "--input", tmp / "in" / "b.csv", "--output", tmp / "out")
    os.remove(tmp / "in" / "b.csv")
    os.makedirs(tmp / "in" / "archive")  # and Parquet input is listed as CSV is
    os.makedirs(tmp / "in" / "old")
    with pytest.raises(
        ConversionError,
        match=r"matches .*in/archive, a directory \(and 1 other path.*would skip.*--input '.*in/\*\.csv'",
    ):
        run_convert("--source", "parquet", "--input", tmp / "in" / "*", "--output", tmp / "out")
    assert not os.path.exists(tmp / "out")


def test_columns_named_twice_and_seeds_out_of_range_name_their_flag(tmp):
    from beam_jobs import WriteDataset

    src = write_text(tmp / "a.csv", "a,b\n1,2\n")
    with pytest.raises(ConversionError, match=r"--columns names \['a'\] more than once"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--columns", "a,b,a")
    for seed in ("-1", str(2**63)):
        with pytest.raises(ConversionError, match=rf"--seed must be an integer in \[0, 2\*\*63\), got {seed}"):
            run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--seed", seed)
    with pytest.raises(ConversionError, match=r"--seed must be an integer"):
        WriteDataset(str(tmp / "out"), seed=-5)
    assert not os.path.exists(tmp / "out")


def test_no_matching_input_is_an_error_before_running(tmp):
    with pytest.raises(ConversionError, match=r"no files match --input .*nothing-\*\.csv"):
        run_convert("--source", "csv", "--input", tmp / "nothing-*.csv", "--output", tmp / "out")


def test_zero_byte_file_is_an_error_naming_it(tmp):
    write_text(tmp / "in" / "a.csv", "")
    with pytest.raises(ValueError, match=r"a\.csv is empty: a CSV file needs a header row"):
        run_convert("--source", "csv", "--input", tmp / "in" / "a.csv", "--output", tmp / "out")


def test_header_only_corpus_is_an_error_not_an_empty_dataset(tmp):
    src = write_text(tmp / "in" / "a.csv", "a,b\n")
    with pytest.raises(Exception, match=r"no records were read .*refusing to write an empty dataset"):
        run_convert(
            "--source", "csv", "--input", src, "--output", tmp / "out", "--column", "a:int64", "--column", "b:int64"
        )
    assert not os.path.exists(tmp / "out" / "dataset_info.json")


def test_column_selection_and_unknown_columns(tmp):
    src = write_text(tmp / "in" / "a.csv", "a,b,c\n1,2,3\n")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--columns", "c,a")
    assert [f.name for f in info.features] == ["c", "a"]
    assert read_examples(tmp / "out") == [{"c": [3], "a": [1]}]
    with pytest.raises(ConversionError, match=r"--columns names \['nope'\].*its columns: \['a', 'b', 'c'\]"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "o2", "--columns", "a,nope")


def test_existing_dataset_is_refused_without_overwrite(tmp):
    src = write_text(tmp / "in" / "a.csv", "a\n1\n2\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--num_shards", "2")
    with pytest.raises(ConversionError, match=r"already holds a dataset .*--overwrite"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out")
    write_text(tmp / "in" / "a.csv", "a\n5\n")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--overwrite")
    assert read_examples(tmp / "out") == [{"a": [5]}]
    # The old shards are gone; the new one may carry a fresh name (the old dataset
    # stayed readable until the new metadata landed).
    shard = info.split("train").shards[0]
    assert sorted(os.listdir(tmp / "out")) == sorted(["dataset_info.json", shard.filename, shard.index])
    assert info.split("train").records == 1


def test_rerun_after_an_interrupted_job_cleans_up_and_succeeds(tmp):
    src = write_text(tmp / "in" / "a.csv", "a\n1\n2\n3\n")
    out = tmp / "out"
    # What a job killed mid-way leaves: its temp dir, with its marker (a pid that is no
    # longer running) and fragments, but no metadata. (Files outside a temp dir that no
    # metadata lists are the user's and are refused: see test_output_dir.py.)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    temp = out / (contract.TEMP_PREFIX + "dead")
    write_text(
        temp / "job.json",
        json.dumps(
            {"job_id": "dead", "started": 0, "host": socket.gethostname(), "pid": int(dead.stdout), "state": "running"}
        ),
    )
    write_text(temp / "fragments" / "000-00000" / "x.tfrecord", "partial")
    info = run_convert("--source", "csv", "--input", src, "--output", out)
    assert sorted(os.listdir(out)) == [
        "dataset_info.json",
        "train-00000-of-00001.tfrecord",
        "train-00000-of-00001.tfrecord.index",
    ]
    assert info.split("train").records == 3


def _split_ids(out, splits):
    return {s: sorted(r["id"][0] for r in read_examples(out, s)) for s in splits}


@pytest.mark.slow
def test_split_assignment_is_identical_across_reruns_and_runner_modes(tmp):
    lines = [f"{i},{i % 7}\n" for i in range(3000)]
    write_text(tmp / "in" / "a.csv", "id,v\n" + "".join(lines[:1400]))
    write_text(tmp / "in" / "b.csv", "id,v\n" + "".join(lines[1400:]))
    args = [
        "--source",
        "csv",
        "--input",
        tmp / "in" / "*.csv",
        "--splits",
        "train=0.7,eval=0.2,test=0.1",
        "--num_shards",
        "3",
    ]
    run_convert(*args, "--output", tmp / "o1")
    run_convert(*args, "--output", tmp / "o2")
    run_convert(*args, "--output", tmp / "o3", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    first = _split_ids(tmp / "o1", ["train", "eval", "test"])
    assert sorted(sum(first.values(), [])) == list(range(3000))
    assert 0.65 < len(first["train"]) / 3000 < 0.75 and 0.07 < len(first["test"]) / 3000 < 0.13
    assert _split_ids(tmp / "o2", ["train", "eval", "test"]) == first
    assert _split_ids(tmp / "o3", ["train", "eval", "test"]) == first


def test_split_key_keeps_rows_with_the_same_key_together(tmp):
    body = "user,v\n" + "".join(f"u{i % 50},{i}\n" for i in range(2000))
    src = write_text(tmp / "in" / "a.csv", body)
    run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "out",
        "--splits",
        "train=0.5,eval=0.5",
        "--split_key",
        "user",
    )
    train = {r["user"][0] for r in read_examples(tmp / "out", "train")}
    evals = {r["user"][0] for r in read_examples(tmp / "out", "eval")}
    assert train and evals and not train & evals
    assert len(train | evals) == 50


def test_shard_names_counts_and_gzip(tmp):
    src = write_text(tmp / "in" / "a.csv", "a\n" + "".join(f"{i}\n" for i in range(1000)))
    info = run_convert(
        "--source", "csv", "--input", src, "--output", tmp / "out", "--num_shards", "4", "--compression", "gzip"
    )
    names = [s.filename for s in info.split("train").shards]
    assert names == [f"train-0000{i}-of-00004.tfrecord.gz" for i in range(4)]
    assert sum(s.records for s in info.split("train").shards) == 1000
    assert all(150 < s.records < 350 for s in info.split("train").shards)
    assert all(os.path.getsize(tmp / "out" / n) == s.bytes for n, s in zip(names, info.split("train").shards))
    assert sorted(r["a"][0] for r in read_examples(tmp / "out")) == list(range(1000))


def test_no_shuffle_keeps_source_order_within_each_shard(tmp):
    src = write_text(tmp / "in" / "a.csv", "a\n" + "".join(f"{i}\n" for i in range(5000)))
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--num_shards", "3", "--no_shuffle")

    seen = []
    for shard in info.split("train").shards:
        values = [r["a"][0] for r in read_shard(tmp / "out", shard.filename)]
        assert values == sorted(values)
        seen += values
    assert sorted(seen) == list(range(5000))
    shuffled = run_convert("--source", "csv", "--input", src, "--output", tmp / "o2", "--num_shards", "3")
    first = [r["a"][0] for r in read_shard(tmp / "o2", shuffled.split("train").shards[0].filename)]
    assert first != sorted(first)


@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_the_commit_shuffles_each_shard_and_keeps_every_record(tmp, layout):
    """End to end with the default strategy; each strategy is tested directly in
    test_commit.py and test_commit_blocks.py. Both layouts shuffle row by row."""
    src = write_text(tmp / "in" / "a.csv", "a\n" + "".join(f"{i}\n" for i in range(5000)))
    info = run_convert(
        "--source",
        "csv",
        "--input",
        src,
        "--num_shards",
        "2",
        "--seed",
        "3",
        "--csv_split_mb",
        "0.005",
        "--output",
        tmp / "merged",
        "--layout",
        layout,
        *(["--block_rows", "100"] if layout == "blocks" else []),
    )  # a few runs per shard: interleaved
    values = [r["a"][0] for r in read_examples(tmp / "merged")]
    assert sorted(values) == list(range(5000)) and values != sorted(values)
    # Well mixed: the first fifth of the output draws on every fifth of the input.
    assert set(np.array(values[:1000]) // 1000) == {0, 1, 2, 3, 4}
    assert sum(s.records for s in info.split("train").shards) == 5000


def test_metadata_records_the_contract(tmp):
    src = write_text(tmp / "in" / "a.csv", "x,y\n1,a\n2,b\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--label", "x")
    meta = json.load(open(tmp / "out" / "dataset_info.json"))
    assert meta["format_version"] == 4 and meta["layout"] == "blocks" and meta["compression"] == "none"
    assert meta["label"] == "x"
    assert meta["features"][1] == {
        "name": "y",
        "dtype": "bytes",
        "shape": [],
        "missing": 0,
        "default": "",
        "role": None,
        "text": True,
        "min_length": None,
        "max_length": None,
    }
    assert meta["splits"][0]["records"] == 2 and meta["splits"][0]["shards"][0]["records"] == 2
    assert meta["source"]["format"] == "csv" and meta["source"]["schema"] == "inferred"
    assert meta["source"]["input"].endswith("a.csv") and meta["source"]["files"] == 1
    assert meta["options"]["splits"] == {"train": 1.0} and meta["options"]["shuffle"] is True
    assert meta["quarantine"] == {"records": 0, "reasons": {}, "path": "quarantine/", "files": []}


def test_cli_prints_a_summary_and_errors_name_the_fix(tmp, capsys):
    from beam_jobs.convert import main

    src = write_text(tmp / "in" / "a.csv", "a\n1\n")
    assert main(["--source", "csv", "--input", str(src), "--output", str(tmp / "out")]) == 0
    assert "| train | 1 | 1 |" in capsys.readouterr().out
    assert main(["--source", "csv", "--input", str(src), "--output", str(tmp / "out")]) == 1
    assert "pass --overwrite" in capsys.readouterr().err


def test_long_runs_log_progress_lines(tmp, caplog, monkeypatch):
    from beam_jobs import _pipeline

    monkeypatch.setattr(_pipeline, "_PROGRESS_EVERY_S", 0.0)
    src = write_text(tmp / "in" / "a.csv", "a\n" + "".join(f"{i}\n" for i in range(300_000)))
    with caplog.at_level("INFO", logger="beam_jobs"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out")
    progress = [r.getMessage() for r in caplog.records if "rows in this worker" in r.getMessage()]
    assert progress and "converted" in progress[0] and "rows/s" in progress[0]


def test_a_text_label_is_recorded_with_its_classes_and_yielded_as_class_ids(tmp):
    import tensorflow as tf

    import ingest

    rng = np.random.default_rng(0)
    species = rng.choice(["Gentoo", "Adelie", "Chinstrap"], 300)
    src = write_text(
        tmp / "p.csv", "id,bill,species\n" + "".join(f"{i},{rng.normal():.3f},{s}\n" for i, s in enumerate(species))
    )
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "ds", "--label", "species")
    assert info.labels == ingest.load_info(str(tmp / "ds")).labels == ("Adelie", "Chinstrap", "Gentoo")
    ids, ys = [], []
    for features, y in ingest.make_dataset(str(tmp / "ds"), batch_size=64, shuffle=False):
        assert y.dtype == tf.int64
        ids += features["id"].numpy().tolist()
        ys += y.numpy().tolist()
    assert sorted(ids) == list(range(300)) and [info.labels[y] for y in ys] == [species[i] for i in ids]
    _, text = next(iter(ingest.make_dataset(str(tmp / "ds"), batch_size=8, shuffle=False, label_ids=False)))
    assert text.dtype == tf.string and set(text.numpy()) <= {b"Adelie", b"Chinstrap", b"Gentoo"}
    # Keras takes the ids as they come.
    bill = tf.keras.Input(shape=(), name="bill")
    model = tf.keras.Model({"bill": bill}, tf.keras.layers.Dense(3, "softmax")(tf.keras.layers.Reshape((1,))(bill)))
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(ingest.make_dataset(str(tmp / "ds"), batch_size=32, features=["bill"]), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


@pytest.mark.parametrize("classes", [1_001, 4_000])
def test_a_text_label_past_the_stored_top_values_still_gets_every_class(tmp, classes):
    import tensorflow as tf

    import ingest

    # Past the 1,000 values the statistics store, below the 10,000 counted exactly.
    rows = [(i, f"c{i % classes:05d}") for i in range(classes + 500)]
    src = write_text(tmp / "p.csv", "id,species\n" + "".join(f"{i},{s}\n" for i, s in rows))
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "ds", "--label", "species")
    stats = info.statistics.feature("species")
    assert stats.distinct == classes and stats.distinct_exact and len(stats.top) == 1_000
    assert info.labels == tuple(f"c{k:05d}" for k in range(classes)) and not info.warnings
    got = {}
    for features, y in ingest.make_dataset(str(tmp / "ds"), batch_size=512, shuffle=False):
        assert y.dtype == tf.int64
        got.update(zip(features["id"].numpy().tolist(), y.numpy().tolist()))
    assert {i: info.labels[y] for i, y in got.items()} == dict(rows)


def test_a_text_label_without_statistics_records_why_it_has_no_classes(tmp, caplog):
    import logging

    import ingest

    src = write_text(tmp / "p.csv", "x,species\n1,a\n2,b\n3,a\n")
    info = run_convert(
        "--source", "csv", "--input", src, "--output", tmp / "ds", "--label", "species", "--no_statistics"
    )
    assert info.labels == () and any("text label 'species': its classes are not recorded" in w for w in info.warnings)
    with caplog.at_level(logging.WARNING, logger="ingest.metadata._facts"):
        _, y = next(iter(ingest.make_dataset(str(tmp / "ds"), batch_size=3, shuffle=False)))
    assert sorted(y.numpy()) == [b"a", b"a", b"b"] and "is yielded as text" in caplog.text


def test_the_default_null_markers_are_listed_in_help_and_docs_and_null_values_empty_turns_them_off(tmp):
    # The markers were read as missing values without --help or the docs saying which.
    markers = ["NA", "N/A", "null", "NULL"]
    helptext = " ".join(convert.build_parser().format_help().split())
    assert "(default: NA,N/A,null,NULL)" in helptext and "'' for none" in helptext
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "conversion.md")).read()
    assert all(f"`{m}`" in docs for m in markers) and "`--null_values ''`" in docs
    src = write_text(tmp / "in" / "a.csv", "k,v\n" + "".join(f"{i},{m}\n" for i, m in enumerate(markers)) + '9,"NA"\n')
    rows = {r["k"][0]: r for r in read_examples(_convert_to(src, tmp / "default"))}
    assert all("v" not in rows[i] for i in range(4)) and rows[9]["v"] == [b"NA"]
    rows = {r["k"][0]: r for r in read_examples(_convert_to(src, tmp / "none", "--null_values", ""))}
    assert [rows[i]["v"] for i in (0, 1, 2, 3, 9)] == [[m.encode()] for m in markers] + [[b"NA"]]
    rows = {r["k"][0]: r for r in read_examples(_convert_to(src, tmp / "given", "--null_values", "N/A"))}
    assert "v" not in rows[1] and rows[0]["v"] == [b"NA"] and rows[2]["v"] == [b"null"]


def _convert_to(src, out, *args) -> str:
    run_convert("--source", "csv", "--input", src, "--output", out, *args)
    return str(out)
