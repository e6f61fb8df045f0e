"""The same dataset from one in-process worker and from two worker processes (#48 item 2).

Beam's multi-process DirectRunner (`--direct_running_mode=multi_processing`) runs the job
in SDK-harness worker processes, as Dataflow's Runner v2 does: bundles of input go to
whichever worker is free, so the chunks of one file land in several bundles. Every
output file must still be the in-process worker's, byte for byte (shards, block
indexes, vocabularies), the quarantine the same records, and the metadata the same
apart from sums added in another order. WriteDataset's rows carry no place in an input,
so its shards are compared by their records.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jobs.sources.image_listing import ITEM_IMAGES
from ingest import contract
from tests.conftest import quarantine_lines, read_examples, run_convert, write_text

pytestmark = pytest.mark.slow

TWO_WORKERS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
_LIMIT_ENV = "INGEST_TEST_VOCABULARY_LIMIT"
_HOOKS = os.path.join(os.path.dirname(__file__), "vocabulary_limit_hook")
# Metadata that says how or when a job ran, not what it wrote.
_RUN_FIELDS = {"created", "job", "options", "runner", "timings", "conversion", "source"}


@pytest.fixture
def small_vocabularies(monkeypatch):
    """A vocabulary limit of 100 in this process and in the runner's worker processes
    (they start with the hook's directory on their path and read the limit from the
    environment): a text feature past it needs 101 values, not 2^17 + 1."""
    monkeypatch.setattr(contract, "VOCABULARY_LIMIT", 100)
    monkeypatch.setenv(_LIMIT_ENV, "100")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([_HOOKS, os.environ.get("PYTHONPATH", "")]))


def _csv_files(root, *, files=3, rows=4000) -> str:
    """Files of numbers, a dozen words, ids past the vocabulary limit, missing values and a
    bad row in each: several byte ranges a file at --csv_split_mb 0.02."""
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(12)]
    for f in range(files):
        lines = ["id,x,word,tag,amount"]
        for i in range(rows):
            n = f * rows + i
            x = "" if n % 17 == 0 else f"{rng.normal():.6f}"
            amount = "oops" if i == rows // 2 else f"{rng.uniform(0, 1e6):.2f}"
            lines.append(f"{n},{x},{words[n % 12]},t{rng.integers(0, 400)},{amount}")
        write_text(root / f"part-{f}.csv", "\n".join(lines) + "\n")
    return str(root / "*.csv")


def _files(ds) -> dict:
    """The dataset's files by what they are, {(split, shard) | (split, shard, "index") |
    vocabulary name: bytes}, found through its metadata: an --overwrite writes new file
    names beside the old ones. Checks that no other file lies in the directory but the
    quarantine (and a job's temp dir: a dead job leaves its own)."""
    info = json.load(open(os.path.join(ds, contract.METADATA_FILENAME)))
    named = {}
    for split in info["splits"]:
        for i, shard in enumerate(split["shards"]):
            named[(split["name"], i)] = shard["filename"]
            if "index" in shard:
                named[(split["name"], i, "index")] = shard["index"]
    for name, v in info.get("vocabularies", {}).items():
        named[name] = v["file"]
    present = set()
    for base, dirs, names in os.walk(ds):
        dirs[:] = [d for d in dirs if not d.startswith("_ingest_tmp-") and d != "quarantine"]
        present |= {os.path.relpath(os.path.join(base, n), ds) for n in names}
    assert present == {*named.values(), contract.METADATA_FILENAME}, "files the metadata does not name"
    return {role: open(os.path.join(ds, rel), "rb").read() for role, rel in named.items()}


_NAMES = {"filename", "index", "file", "path"}  # where a file lies: compared by `_files`


def _unnamed(value):
    if isinstance(value, dict):
        return {k: _unnamed(v) for k, v in value.items() if k not in _NAMES}
    if isinstance(value, list):
        return [_unnamed(v) for v in value]
    return value


def _approx_sums(value, path=""):
    """The metadata with every mean and std rounded to 9 significant digits: the same sums,
    added in another order by another number of workers."""
    if isinstance(value, dict):
        return {
            k: (float(f"{v:.9g}") if k in ("mean", "std") and isinstance(v, float) else _approx_sums(v, f"{path}/{k}"))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_approx_sums(v, path) for v in value]
    return value


def _metadata(ds, *, fingerprints: bool = True, quantiles: bool = True) -> dict:
    """The metadata but how the job ran, and but how its quarantine is cut into files (one
    a worker's bundle that had bad rows: the records are compared by `_quarantined`)."""
    info = json.load(open(os.path.join(ds, contract.METADATA_FILENAME)))
    info = {k: v for k, v in info.items() if k not in _RUN_FIELDS}
    if "files" in info.get("quarantine", {}):
        files = info["quarantine"].pop("files")
        assert sum(f["records"] for f in files) == info["quarantine"]["records"]
    info = _approx_sums(_unnamed(info))
    if not quantiles:
        for feature in _feature_statistics(info):
            feature.pop("quantiles", None)
    if not fingerprints:
        for split in info["splits"]:
            for shard in split["shards"]:
                shard.pop("fingerprint")
    return info


def _feature_statistics(info: dict) -> list:
    stats = info.get("statistics", {})
    return [f for split in [stats.get("overall", {}), *stats.get("splits", {}).values()] for f in split.values()]


def _assert_close_quantiles(one, two) -> None:
    """Past a few thousand values a feature's quantiles come from a sample, so another
    grouping of the rows gives others: each within 1% of the feature's range."""
    a, b = (_feature_statistics(json.load(open(os.path.join(ds, contract.METADATA_FILENAME)))) for ds in (one, two))
    for fa, fb in zip(a, b):
        if fa.get("quantiles"):
            span = fa["max"] - fa["min"]
            assert len(fa["quantiles"]) == len(fb["quantiles"])
            assert np.max(np.abs(np.subtract(fa["quantiles"], fb["quantiles"]))) <= 0.01 * span


def _quarantined(ds, *, places: bool = True) -> list:
    """The quarantined records; without `places`, but where they were (WriteDataset's rows
    have no file: their source is a random batch number, and the row their place in it)."""
    lines = quarantine_lines(ds)
    if not places:
        lines = [{k: v for k, v in line.items() if k not in ("source", "row")} for line in lines]
    return sorted(json.dumps(line, sort_keys=True) for line in lines)


def _assert_same_dataset(one, two, *, sampled_quantiles: bool = False) -> None:
    a, b = _files(one), _files(two)
    assert sorted(a, key=str) == sorted(b, key=str)
    differ = [role for role in a if a[role] != b[role]]
    assert not differ, f"files that differ between one worker and two: {differ}"
    if sampled_quantiles:
        assert _metadata(one, quantiles=False) == _metadata(two, quantiles=False)
        _assert_close_quantiles(one, two)
    else:
        assert _metadata(one) == _metadata(two)
    assert _quarantined(one) == _quarantined(two)


def test_csv_over_files_and_ranges_with_bad_rows_splits_and_a_vocabulary_past_its_limit(tmp, small_vocabularies):
    src = _csv_files(tmp / "in")
    args = ["--source", "csv", "--input", src, "--csv_split_mb", "0.02", "--label", "id"]
    args += ["--splits", "train=0.8,eval=0.2", "--max_bad_fraction", "0.01"]
    one = run_convert(*args, "--output", tmp / "one")
    run_convert(*args, "--output", tmp / "two", *TWO_WORKERS)
    # What the case is made of, so that it cannot pass by holding less.
    assert [s.name for s in one.splits] == ["train", "eval"] and one.quarantine["records"] == 3
    assert one.vocabularies["word"]["size"] == 12 and "tag" not in one.vocabularies  # tag: 400 values > 100
    _assert_same_dataset(tmp / "one", tmp / "two")
    ids = sorted(r["id"][0] for s in ("train", "eval") for r in read_examples(tmp / "two", s))
    assert ids == [n for n in range(12000) if n % 4000 != 2000]


def test_parquet_carried_by_schema_from(tmp):
    rng = np.random.default_rng(8)
    n = 6000

    def table(offset):
        return pa.table(
            {
                "id": pa.array(np.arange(offset, offset + n)),
                "x": pa.array(rng.normal(size=n)),
                "word": pa.array([f"w{i % 12}" for i in range(n)]),
                "amount": pa.array(rng.uniform(0, 1e6, n)),
            }
        )

    (tmp / "in").mkdir()
    pq.write_table(table(0), tmp / "in" / "day1.parquet", row_group_size=1000)
    for i in range(3):
        pq.write_table(table(n * (i + 1)), tmp / "in" / f"day2-{i}.parquet", row_group_size=1000)
    run_convert("--source", "parquet", "--input", tmp / "in" / "day1.parquet", "--output", tmp / "day1")
    args = ["--source", "parquet", "--input", tmp / "in" / "day2-*.parquet", "--schema_from", tmp / "day1"]
    run_convert(*args, "--output", tmp / "one")
    run_convert(*args, "--output", tmp / "two", *TWO_WORKERS)
    _assert_same_dataset(tmp / "one", tmp / "two")
    assert len(read_examples(tmp / "two")) == 3 * n


def test_images_with_a_bad_one(tmp):
    from PIL import Image

    rng = np.random.default_rng(9)
    # More images than one work item holds (ITEM_IMAGES, 128): the workers split them.
    for label in ("cat", "dog", "eel"):
        for i in range(50):
            path = tmp / "in" / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), "RGB").save(path, "PNG")
    (tmp / "in" / "dog" / "broken.png").write_bytes(b"not a picture")
    args = ["--source", "images", "--input", tmp / "in", "--max_bad_fraction", "0.1", "--splits", "train=0.7,eval=0.3"]
    assert 3 * 50 + 1 > ITEM_IMAGES
    one = run_convert(*args, "--output", tmp / "one")
    run_convert(*args, "--output", tmp / "two", *TWO_WORKERS)
    assert one.quarantine["records"] == 1
    _assert_same_dataset(tmp / "one", tmp / "two")


def test_write_dataset_from_two_workers_holds_the_same_records(tmp):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs import WriteDataset

    rows = [{"id": i, "word": f"w{i % 12}", "x": float(i) / 7} for i in range(5000)]
    rows[123]["x"] = "not a number"

    def write(out, options):
        with beam.Pipeline(options=PipelineOptions(list(options))) as p:
            _ = (
                p
                | beam.Create(rows)
                | WriteDataset(str(out), splits={"train": 0.8, "eval": 0.2}, max_bad_fraction=0.01)
            )

    write(tmp / "one", [])
    write(tmp / "two", TWO_WORKERS)

    def records(ds):
        return {
            s: collections.Counter(repr(sorted(r.items())) for r in read_examples(ds, s)) for s in ("train", "eval")
        }

    assert records(tmp / "one") == records(tmp / "two")
    assert sum(sum(c.values()) for c in records(tmp / "two").values()) == 4999
    # Its shards' fingerprints are of their bytes, which the records' order makes.
    assert _metadata(tmp / "one", fingerprints=False) == _metadata(tmp / "two", fingerprints=False)
    assert _quarantined(tmp / "one", places=False) == _quarantined(tmp / "two", places=False)


def _workers(root: int) -> list:
    """PIDs of the SDK worker processes below `root` (the runner starts each through a shell)."""
    from benchmarks._measure import descendants

    def cmdline(pid) -> bytes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except OSError:  # gone since the listing
            return b""

    return [p for p in descendants(root)[1:] if b"sdk_worker_main" in (c := cmdline(p)) and b"/bin/sh" not in c]


def _writing_fragments(out) -> bool:
    return any(
        files for d in glob.glob(str(out / "_ingest_tmp-*")) for _, _, files in os.walk(os.path.join(d, "fragments"))
    )


def test_a_worker_killed_mid_job_leaves_the_old_dataset_whole_and_the_rerun_is_exact(tmp):
    src = _csv_files(tmp / "in", files=4, rows=60000)
    args = ["--source", "csv", "--input", src, "--csv_split_mb", "0.2", "--label", "id", "--max_bad_fraction", "0.01"]
    run_convert("--source", "csv", "--input", str(tmp / "in" / "part-0.csv"), "--output", tmp / "out", "--label", "id")
    old = _files(tmp / "out"), _metadata(tmp / "out", quantiles=False)
    job = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs.convert", *map(str, args), "--output", str(tmp / "out"), "--overwrite"]
        + list(TWO_WORKERS),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # Kill a worker mid-job: once fragments are being written, or a while after both
        # workers are up (the first stage, type inference, runs in them), before any commit.
        deadline, up, victim = time.monotonic() + 120, None, None
        while victim is None and time.monotonic() < deadline and job.poll() is None:
            workers = _workers(job.pid)
            if len(workers) == 2 and up is None:
                up = time.monotonic()
            if workers and (_writing_fragments(tmp / "out") or (up is not None and time.monotonic() > up + 2)):
                victim = workers[0]
            time.sleep(0.02)
        assert victim is not None, "the job never started writing fragments from a worker process: " + (
            f"rc {job.returncode}: " + job.stderr.read().decode()[-300:] if job.poll() is not None else "still running"
        )
        os.kill(victim, signal.SIGKILL)
        try:  # Beam's runner may retry the bundle, fail, or wait on the dead worker: bounded here
            job.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    finally:
        try:  # the job and whatever it started (the other worker), whether it ended or not
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
    # However the job ended, the directory holds one whole dataset: the old one, or the new
    # one complete (the in-process job's).
    now = _files(tmp / "out"), _metadata(tmp / "out", quantiles=False)
    run_convert(*args, "--output", tmp / "fresh")
    new = _files(tmp / "fresh"), _metadata(tmp / "fresh", quantiles=False)
    assert now in (old, new), "the directory holds neither the old dataset nor the new one"
    # A rerun over the dead job's leftovers is exact: the in-process dataset, byte for byte.
    run_convert(*args, "--output", tmp / "out", "--overwrite", *TWO_WORKERS)
    _assert_same_dataset(tmp / "fresh", tmp / "out", sampled_quantiles=True)
    assert not glob.glob(str(tmp / "out" / "_ingest_tmp-*"))  # and the dead job's temp dir is gone
