"""The job's options are declared once (JobOptions): the CLI's flags, WriteDataset's keywords and the
options recorded in dataset_info.json are made from that declaration, and agree."""

from __future__ import annotations

import dataclasses
import inspect

import apache_beam as beam
import pytest

from beam_jobs import WriteDataset, convert
from beam_jobs._job_options import RECORDED, JobOptions
from beam_jobs.sources import ADAPTER_FOR_FORMAT
from ingest import load_info
from tests.conftest import run_convert, write_text

DECLARED = {f.name: f for f in dataclasses.fields(JobOptions)}


def _top_level_actions(parser) -> dict:
    by_source = {g.title.split(" ")[0] for g in parser._action_groups} & set(ADAPTER_FOR_FORMAT)
    of_sources = {id(a) for g in parser._action_groups if g.title.split(" ")[0] in by_source for a in g._group_actions}
    mine = [a for a in parser._actions if id(a) not in of_sources and a.dest not in ("help", "verbose")]
    return {a.dest: a for a in mine if a.option_strings[0] == "--" + a.dest}  # --no_x: the same dest


def test_every_flag_is_a_declared_option_with_its_type_default_choices_and_help():
    actions = _top_level_actions(convert.build_parser())
    assert set(actions) == set(DECLARED)
    for name, f in DECLARED.items():
        action, md = actions[name], f.metadata
        assert action.help == md["help"], name
        if md["cli"] in ("value",):
            assert (action.type, action.default) == (md["type"], f.default), name
            assert tuple(action.choices or ()) == tuple(md["choices"] or ()), name
        if md["cli"] == "negatable":
            negation = convert.build_parser()._option_string_actions[f"--no_{name}"]
            assert action.default is f.default is True and (negation.dest, negation.help) == (name, md["off_help"])


def test_write_dataset_takes_every_keyword_option_with_the_same_default():
    params = inspect.signature(WriteDataset.__init__).parameters
    keywords = {n: p.default for n, p in params.items() if n not in ("self", "output", "batch_rows")}
    assert keywords == {n: f.default for n, f in DECLARED.items() if f.metadata["keyword"]}
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in keywords)
    for name in keywords:
        assert f"      {name}: " in WriteDataset.__doc__
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['lable'\]; it takes \[.*'label'"):
        WriteDataset("out", lable="y")


def test_the_cli_and_write_dataset_build_the_same_options():
    argv = ["--source", "csv", "--input", "x.csv", "--output", "out/", "--columns", "a,b", "--label", "b"]
    argv += ["--splits", "train=0.75,eval=0.25", "--no_shuffle", "--seed", "3", "--layout", "blocks"]
    argv += ["--block_rows", "64", "--no_statistics", "--compression", "gzip", "--max_bad_fraction", "0.1"]
    from_cli = JobOptions.from_args(convert.build_parser().parse_args(argv))
    from_keywords = JobOptions.of_keywords(
        "out",
        columns=["a", "b"],
        label="b",
        splits={"train": 0.75, "eval": 0.25},
        shuffle=False,
        seed=3,
        layout="blocks",
        block_rows=64,
        statistics=False,
        compression="gzip",
        max_bad_fraction=0.1,
    )
    assert dataclasses.replace(from_cli, source="rows", input="<PCollection>") == from_keywords


def test_the_metadata_records_the_declared_options(tmp):
    src = write_text(tmp / "a.csv", "a,b\n1,2\n3,4\n")
    info = run_convert("--source", "csv", "--input", src, "--output", tmp / "cli", "--label", "b")
    csv_own = set(info.options) - set(RECORDED)
    assert list(info.options)[: len(RECORDED)] == list(RECORDED) and csv_own
    assert csv_own.isdisjoint(DECLARED)  # the rest is the source's own (ADAPTER_FOR_FORMAT["csv"].recorded)
    with beam.Pipeline() as p:
        _ = p | beam.Create([{"a": 1, "b": 2}]) | WriteDataset(str(tmp / "rows"), label="b")
    assert list(load_info(str(tmp / "rows")).options)[: len(RECORDED)] == list(RECORDED)


def test_the_metadata_refuses_block_rows_past_the_conversions_limit():
    from beam_jobs._job_options import MAX_BLOCK_ROWS
    from ingest import contract

    shard = contract.ShardInfo("train-00000-of-00001.tfrecord", records=1, bytes=16, blocks=1)
    split = contract.SplitInfo("train", (shard,))
    feature = contract.FeatureSpec("x", "int64")
    contract.DatasetInfo(features=(feature,), splits=(split,), layout="blocks", block_rows=MAX_BLOCK_ROWS)
    with pytest.raises(ValueError, match=rf"block_rows must be in \[1, {MAX_BLOCK_ROWS}\].*got {MAX_BLOCK_ROWS + 1}"):
        contract.DatasetInfo(features=(feature,), splits=(split,), layout="blocks", block_rows=MAX_BLOCK_ROWS + 1)
