"""The conversion job translates to a Dataflow job without network access (Beam's --dry_run)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, TypeOptions
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    for stage in (
        "Convert/CountTypes",
        "Convert/ConvertFiles",
        "Convert/GroupFragments",
        "Convert/CommitShards",
        "Convert/MergeStats",
        "Convert/Finalize",
    ):
        assert any(name.startswith(stage) for name in steps), stage
    assert result.job.options.view_as(PipelineOptions).get_all_options()["project"] == "test-project"


def test_pipeline_type_checking_is_off_unless_asked_for():
    assert not convert.pipeline_options(["--runner=DirectRunner"]).view_as(TypeOptions).pipeline_type_check
    assert convert.pipeline_options(["--pipeline_type_check"]).view_as(TypeOptions).pipeline_type_check


def test_bundles_run_here_sample_their_state_briefly_and_only_while_the_job_runs(tmp, monkeypatch):
    from apache_beam.runners.worker import statesampler

    from beam_jobs import _in_process

    periods = []
    start = statesampler.StateSampler.start

    def recording(self):
        periods.append(self.sampling_period_ms)
        start(self)

    monkeypatch.setattr(statesampler.StateSampler, "start", recording)
    src = write_text(tmp / "in" / "a.csv", "x,y\n1,a\n2,b\n")
    convert.run(["--source", "csv", "--input", str(src), "--output", str(tmp / "out")])
    # Every bundle's end waits for the sampler's sleep: Beam's 200 ms would be idle time.
    assert periods and set(periods) == {_in_process.SAMPLING_PERIOD_MS}
    assert statesampler.StateSampler("after", None).sampling_period_ms == statesampler.DEFAULT_SAMPLING_PERIOD_MS


def test_run_through_the_cli_with_dry_run_writes_nothing(tmp):
    src = write_text(tmp / "in" / "a.csv", "x\n1\n")
    info = convert.run(["--source", "csv", "--input", str(src), "--output", str(tmp / "out"), *DATAFLOW_FLAGS])
    assert info is None
    assert not (tmp / "out" / "dataset_info.json").exists()


REPO = pathlib.Path(__file__).resolve().parents[1]


def _staged(options, tmp) -> dict:
    """What Beam's stager (the code DataflowRunner calls at submission) would upload: {name: local file}."""
    from apache_beam.runners.portability.stager import Stager

    tmp.mkdir(parents=True, exist_ok=True)
    resources = Stager.create_job_resources(options, str(tmp), log_submission_env_dependencies=False)
    return {_staged_name(r): _local_path(r) for r in resources}


def _staged_name(artifact) -> str:
    from apache_beam.portability.api import beam_runner_api_pb2

    payload = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
    return payload.staged_name


def _local_path(artifact) -> str:
    from apache_beam.portability.api import beam_runner_api_pb2

    return beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path


# What a worker must have to convert, and what it must not be made to install: the
# runtime's and the benchmarks' heavy dependencies (gigabytes, minutes of start-up).
WORKER_NEEDS = {"apache-beam", "pyarrow", "numpy", "google-crc32c", "pillow"}
NOT_ON_WORKERS = {"tensorflow", "matplotlib", "tfx-bsl"}


def _worker_requirements(metadata: str) -> set:
    """What `pip install` of the staged package brings along: the Requires-Dist lines no extra gates."""
    from email.parser import HeaderParser

    reqs = [Requirement(line) for line in HeaderParser().parsestr(metadata).get_all("Requires-Dist", [])]
    return {canonicalize_name(r.name) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})}


def _translate(tmp, *extra):
    src = write_text(tmp / "in" / "a.csv", "x,y\n1,a\n2,b\n")
    argv = ["--source", "csv", "--input", str(src), "--output", str(tmp / "out"), *DATAFLOW_FLAGS, *extra]
    args, beam_args = convert.build_parser().parse_known_args(argv)
    options = PipelineOptions(beam_args)
    result = convert.build_pipeline(convert.make_config(args, options), options).run()
    steps = {t.unique_name for t in result.job.proto_pipeline.components.transforms.values()}
    assert any(name.startswith("Convert/ConvertFiles") for name in steps)
    return options, result


@pytest.mark.slow
def test_setup_file_stages_an_sdist_with_both_packages(tmp):
    options, result = _translate(tmp, f"--setup_file={REPO / 'pyproject.toml'}")
    assert result.job.options.view_as(SetupOptions).setup_file == str(REPO / "pyproject.toml")
    staged = _staged(options, tmp / "staging")
    assert "workflow.tar.gz" in staged
    with tarfile.open(staged["workflow.tar.gz"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        (pkg_info,) = [n for n in tar.getnames() if n.count("/") == 1 and n.endswith("/PKG-INFO")]
        requirements = _worker_requirements(tar.extractfile(pkg_info).read().decode())
    assert {
        "beam_jobs/_pipeline.py",
        "beam_jobs/sources/image_records.py",
        "ingest/contract.py",
        "pyproject.toml",
    } <= names
    assert WORKER_NEEDS <= requirements and not requirements & NOT_ON_WORKERS, requirements


@pytest.mark.slow
def test_extra_package_stages_a_built_wheel(tmp):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp / "dist").glob("ingest-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert {"beam_jobs/convert.py", "ingest/contract.py"} <= set(z.namelist())
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requirements = _worker_requirements(z.read(metadata).decode())
    assert WORKER_NEEDS <= requirements and not requirements & NOT_ON_WORKERS, requirements
    options, result = _translate(tmp, f"--extra_package={wheel}")
    assert result.job.options.view_as(SetupOptions).extra_packages == [str(wheel)]
    staged = _staged(options, tmp / "staging")
    assert wheel.name in staged and "extra_packages.txt" in staged
    assert open(staged["extra_packages.txt"]).read().split() == [wheel.name]
