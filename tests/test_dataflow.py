"""The conversion job translates to a Dataflow job without network access (Beam's --dry_run)."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import convert
from tests.conftest import write_text

DATAFLOW_FLAGS = [
    "--runner=DataflowRunner",
    "--project=test-project",
    "--region=us-central1",
    "--temp_location=gs://test-bucket/tmp",
    "--no_auth",
    "--dry_run=True",
    "--sdk_location=container",
]


def test_job_translates_to_dataflow_with_every_stage(tmp):
    src = write_text(tmp / "in" / "a.csv", "x,y\n1,a\n2,b\n")
    argv = ["--source", "csv", "--input", str(src), "--output", str(tmp / "out"), "--label", "x", *DATAFLOW_FLAGS]
    args, beam_args = convert.build_parser().parse_known_args(argv)
    options = PipelineOptions(beam_args)
    cfg = convert.make_config(args, options)
    result = convert.build_pipeline(cfg, options).run()
    steps = {t.unique_name for t in result.job.proto_pipeline.components.transforms.values()}
    for stage in ("Convert/CountTypes", "Convert/ConvertFiles", "Convert/GroupFragments", "Convert/CommitShards", "Convert/MergeStats", "Convert/Finalize"):
        assert any(name.startswith(stage) for name in steps), stage
    assert result.job.options.view_as(PipelineOptions).get_all_options()["project"] == "test-project"


def test_run_through_the_cli_with_dry_run_writes_nothing(tmp):
    src = write_text(tmp / "in" / "a.csv", "x\n1\n")
    info = convert.run(["--source", "csv", "--input", str(src), "--output", str(tmp / "out"), *DATAFLOW_FLAGS])
    assert info is None
    assert not (tmp / "out" / "dataset_info.json").exists()
