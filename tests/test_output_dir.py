"""The output directory: the job deletes only what it wrote, --overwrite is atomic, Finalize
is retry-safe, concurrent jobs are refused, and a failed command prints one error line."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from beam_jobs import _pipeline
from beam_jobs.convert import ConversionError
from beam_jobs.output import directory as output_dir
from ingest import contract
from tests.conftest import read_examples, run_convert, write_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _csv(tmp, name: str, values) -> str:
    return write_text(tmp / "in" / name / "a.csv", "a\n" + "".join(f"{v}\n" for v in values))


def _values(out) -> list:
    return sorted(r["a"][0] for r in read_examples(out) if r["a"])


def _listing(out) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs)


def _dataset_listing(out) -> list:
    info = contract.DatasetInfo.from_json(open(os.path.join(out, contract.METADATA_FILENAME)).read())
    return sorted(output_dir.dataset_files(info) + [contract.METADATA_FILENAME])


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def _marker(out, job: str, **fields) -> str:
    temp = out / (contract.TEMP_PREFIX + job)
    marker = {
        "job_id": job,
        "started": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "state": "running",
    }
    write_text(temp / output_dir.JOB_FILE, json.dumps({**marker, **fields}))
    write_text(temp / "fragments" / "x.tfrecord", "partial")
    return str(temp)


def _cli(*args, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )


# --- item 13: files the job did not write ------------------------------------------------


@pytest.mark.parametrize(
    "foreign", ["train-00000-of-00003.tfrecord", "quarantine/part-00000-of-00001.jsonl", "notes.txt"]
)
def test_foreign_files_are_refused_by_name_and_left_untouched(tmp, foreign):
    src = _csv(tmp, "v1", [1, 2, 3])
    out = tmp / "out"
    write_text(out / foreign, "the user's own data")
    with pytest.raises(
        ConversionError, match=rf"holds 1 file\(s\) that no conversion .* e\.g\. .*{foreign}.*move them away"
    ):
        run_convert("--source", "csv", "--input", src, "--output", out)
    assert _listing(out) == [foreign]
    assert open(out / foreign).read() == "the user's own data"


def test_an_output_named_like_a_pattern_is_listed_literally(tmp):
    out = tmp / "runs[1]"
    write_text(tmp / "runs1" / "other.txt", "another directory the pattern would match")
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2]), "--output", out)
    write_text(out / "notes.txt", "the user's own data")
    with pytest.raises(ConversionError, match=r"holds 1 file\(s\) that no conversion .*notes\.txt"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v2", [3]), "--output", out, "--overwrite")
    assert _values(out) == [1, 2] and open(out / "notes.txt").read() == "the user's own data"


def test_overwrite_deletes_only_what_the_old_metadata_lists(tmp):
    out = tmp / "out"
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2, 3]), "--output", out, "--num_shards", "2")
    write_text(out / "quarantine" / "mine.jsonl", "not the job's")
    with pytest.raises(ConversionError, match=r"e\.g\. .*quarantine/mine\.jsonl"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v2", [4]), "--output", out, "--overwrite")
    assert _values(out) == [1, 2, 3] and open(out / "quarantine" / "mine.jsonl").read() == "not the job's"


def test_a_temp_dir_without_a_marker_is_refused_not_deleted(tmp):
    out = tmp / "out"
    stray = write_text(out / (contract.TEMP_PREFIX + "old") / "fragments" / "x.tfrecord", "partial")
    with pytest.raises(ConversionError, match=r"_ingest_tmp-old/, a conversion temp dir without a readable job\.json"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out)
    assert os.path.exists(stray)


def test_unreadable_metadata_is_refused_not_overwritten(tmp):
    out = tmp / "out"
    write_text(out / contract.METADATA_FILENAME, '{"features": [')
    with pytest.raises(ConversionError, match=r"dataset_info\.json exists but cannot be read as dataset metadata"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out, "--overwrite")
    assert open(out / contract.METADATA_FILENAME).read() == '{"features": ['


# --- item 14: --overwrite is atomic, and a rerun after a kill at Finalize is clean --------

_BEFORE_SWAP = ["after_plan", "mid_moves", "before_swap"]
_AFTER_SWAP = ["after_swap", "mid_cleanup"]


@pytest.mark.slow
@pytest.mark.parametrize("point", _BEFORE_SWAP + _AFTER_SWAP)
def test_a_kill_during_overwrite_leaves_one_whole_dataset_and_a_rerun_is_clean(tmp, point):
    out = tmp / "out"
    common = ["--source", "csv", "--output", out, "--num_shards", "3", "--max_bad_fraction", "0.5"]
    run_convert(*common, "--input", _csv(tmp, "v1", [1, 2, 3, 4, 5, 6, "x"]))
    old_files = _dataset_listing(out)
    killed = _cli(
        "-m",
        "tests.kill_during_finalize",
        point,
        *common,
        "--input",
        _csv(tmp, "v2", [10, 20, 30, 40, 50, 60, "y"]),
        "--overwrite",
    )
    assert killed.returncode == 9, killed.stderr[-2000:]
    # Whatever the moment, the directory holds one whole dataset: the old one until the
    # new metadata landed, the new one after.
    assert _values(out) == ([1, 2, 3, 4, 5, 6] if point in _BEFORE_SWAP else [10, 20, 30, 40, 50, 60])
    if point in _BEFORE_SWAP:
        assert set(old_files) <= set(_listing(out))
    # A rerun finishes or undoes the dead job's commit and leaves nothing else behind.
    info = run_convert(*common, "--input", _csv(tmp, "v3", [7, 8, 9, "z"]), "--overwrite")
    assert _values(out) == [7, 8, 9]
    assert _listing(out) == _dataset_listing(out)
    assert info.quarantine["records"] == 1


@pytest.mark.slow
def test_a_rerun_without_overwrite_after_a_kill_before_the_first_commit_succeeds(tmp):
    out = tmp / "out"
    src = _csv(tmp, "v1", [1, 2, 3, 4])
    killed = _cli(
        "-m",
        "tests.kill_during_finalize",
        "mid_moves",
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        out,
        "--num_shards",
        "2",
    )
    assert killed.returncode == 9, killed.stderr[-2000:]
    assert not os.path.exists(out / contract.METADATA_FILENAME)
    run_convert("--source", "csv", "--input", src, "--output", out, "--num_shards", "2")
    assert _values(out) == [1, 2, 3, 4] and _listing(out) == _dataset_listing(out)


# --- item 15: Finalize is idempotent ---------------------------------------------------


def test_finalize_run_twice_gives_the_same_dataset(tmp, monkeypatch):
    real = _pipeline.finalize_dataset
    record = str(tmp / "finalize-results.jsonl")  # the runner pickles the stage: share results through a file

    def twice(*args, **kwargs):
        for _ in range(2):
            done = real(*args, **kwargs)
            with open(record, "a") as f:
                f.write(json.dumps(done) + "\n")
        return done

    monkeypatch.setattr(_pipeline, "finalize_dataset", twice)
    out = tmp / "out"
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2, 3, 4, 5]), "--output", out, "--num_shards", "2")
    first, second = (json.loads(line) for line in open(record))
    assert first == second == open(out / contract.METADATA_FILENAME).read()
    assert _values(out) == [1, 2, 3, 4, 5] and _listing(out) == _dataset_listing(out)


@pytest.mark.parametrize("overwrite", [False, True])
def test_finalize_failing_after_the_rename_succeeds_when_retried(tmp, monkeypatch, overwrite):
    """A transient error writing the metadata, after the shards were renamed; the retry
    must neither delete the renamed shards nor look for their (gone) sources."""
    out = tmp / "out"
    if overwrite:
        run_convert("--source", "csv", "--input", _csv(tmp, "v0", [0]), "--output", out, "--num_shards", "2")
    real, write_text_real = _pipeline.finalize_dataset, output_dir.write_text
    injected = str(tmp / "fault-injected")

    def flaky_write(path, text):
        if path.endswith("/" + contract.METADATA_FILENAME) and not os.path.exists(injected):
            open(injected, "w").close()
            raise OSError(f"503 Service Unavailable writing {path}")
        write_text_real(path, text)

    def retried(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except OSError:
            assert any(f.endswith(".tfrecord") for f in os.listdir(out)), "the fault came before the rename"
            return real(*args, **kwargs)  # what a runner's bundle retry does

    monkeypatch.setattr(output_dir, "write_text", flaky_write)
    monkeypatch.setattr(_pipeline, "finalize_dataset", retried)
    args = ["--source", "csv", "--input", _csv(tmp, "v1", [1, 2, 3, 4, 5]), "--output", out, "--num_shards", "2"]
    run_convert(*args, *(["--overwrite"] if overwrite else []))
    assert os.path.exists(injected), "the fault was never injected"
    assert _values(out) == [1, 2, 3, 4, 5] and _listing(out) == _dataset_listing(out)


# --- item 16: concurrent jobs ----------------------------------------------------------


def test_a_live_jobs_temp_dir_is_refused_naming_the_job(tmp):
    out = tmp / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        temp = _marker(out, "busyjob", pid=sleeper.pid)
        with pytest.raises(
            ConversionError, match=rf"another conversion is writing into .*job busyjob \(pid {sleeper.pid} on"
        ):
            run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out)
        assert os.path.exists(os.path.join(temp, "fragments", "x.tfrecord"))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_job_on_another_host_is_live_until_it_is_stale(tmp):
    out = tmp / "out"
    _marker(out, "remote", host="some-other-launcher", pid=1, started=time.time() - 3600)
    with pytest.raises(ConversionError, match=r"job remote .*--stale_job_hours"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out)
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out, "--stale_job_hours", "0.5")
    assert _values(out) == [1] and _listing(out) == _dataset_listing(out)


@pytest.mark.parametrize("fields", [{"pid": None}, {"state": "ended"}], ids=["dead_pid", "ended"])
def test_a_dead_or_ended_jobs_temp_dir_is_cleaned_up(tmp, fields):
    out = tmp / "out"
    fields = {k: (_dead_pid() if v is None else v) for k, v in fields.items()}
    _marker(out, "gone", **fields)
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2]), "--output", out)
    assert _values(out) == [1, 2] and _listing(out) == _dataset_listing(out)


def test_a_failed_job_releases_the_directory_for_the_next_run(tmp):
    out = tmp / "out"
    with pytest.raises(ConversionError, match=r"more than --max_bad_fraction"):
        run_convert(
            "--source", "csv", "--input", _csv(tmp, "bad", [1, "x", "y"]), "--output", out, "--column", "a:int64"
        )
    [temp] = [d for d in os.listdir(out) if d.startswith(contract.TEMP_PREFIX)]
    assert json.load(open(out / temp / output_dir.JOB_FILE))["state"] == "ended"
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2]), "--output", out)
    assert _values(out) == [1, 2] and _listing(out) == _dataset_listing(out)


@pytest.mark.slow
def test_two_conversions_into_one_output_one_wins_the_other_is_refused(tmp):
    out = tmp / "out"
    rows = list(range(20000))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "beam_jobs.convert",
                "--source",
                "csv",
                "--input",
                _csv(tmp, f"v{i}", rows),
                "--output",
                str(out),
                "--num_shards",
                "2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        for i in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, err in results if code == 1)
    assert "error: another conversion is writing into" in refused or "already holds a dataset" in refused, refused
    assert "Traceback" not in refused
    assert _values(out) == rows and _listing(out) == _dataset_listing(out)


# --- item 19: one clear error, once ----------------------------------------------------


@pytest.mark.slow
def test_a_failed_command_prints_one_error_line_without_traceback(tmp):
    src = _csv(tmp, "bad", [1, "x", "y"])
    done = _cli(
        "-m", "beam_jobs.convert", "--source", "csv", "--input", src, "--output", tmp / "out", "--column", "a:int64"
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "quarantined" in line]
    assert len(errors) == 1 and errors[0].startswith("error: 2 of 3 rows"), done.stderr
    assert "--column NAME:TYPE" in errors[0]
    assert "Traceback" not in done.stderr
    verbose = _cli(
        "-m",
        "beam_jobs.convert",
        "--source",
        "csv",
        "--input",
        src,
        "--output",
        tmp / "out2",
        "--column",
        "a:int64",
        "-v",
    )
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1].startswith("error: 2 of 3 rows")


# Over 5 s on a busy 2-core machine (a two-worker run, 2026-12-03): the slow tier.
@pytest.mark.slow
def test_the_error_for_bad_images_does_not_suggest_column_types(tmp):
    from PIL import Image

    (tmp / "imgs" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp / "imgs" / "cat" / "ok.png")
    for i in range(3):
        write_text(tmp / "imgs" / "cat" / f"bad{i}.png", "not an image")
    done = _cli("-m", "beam_jobs.convert", "--source", "images", "--input", tmp / "imgs", "--output", tmp / "out")
    assert done.returncode == 1
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert re.search(r"3 of 4 rows .*quarantined", line) and "--column" not in line and "--max_bad_fraction" in line
    assert "Traceback" not in done.stderr


# --- item 4, job side: an empty split is warned about and recorded -----------------------


def test_an_empty_split_is_recorded_as_a_warning(tmp):
    out = tmp / "out"
    info = run_convert(
        "--source",
        "csv",
        "--input",
        _csv(tmp, "v1", [1, 2, 3]),
        "--output",
        out,
        "--splits",
        "train=0.999999,eval=0.000001",
    )
    assert info.split("eval").records == 0
    assert info.warnings == ("split 'eval' received no records",)
    stored = json.load(open(out / contract.METADATA_FILENAME))
    assert stored["warnings"] == ["split 'eval' received no records"]


# --- every deletion goes through one guard: names a conversion writes, inside --output ----


def _edit_metadata(out, edit) -> None:
    path = out / contract.METADATA_FILENAME
    info = json.loads(open(path).read())
    edit(info)
    write_text(path, json.dumps(info))


def _snapshot(root) -> dict:
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(root)
        for f in fs
    }


_OUTSIDE = "<outside>"


@pytest.mark.parametrize(
    "listed",
    ["../victim.txt", _OUTSIDE, contract.METADATA_FILENAME, ".", "quarantine", "quarantine/../../victim.txt"],
)
def test_overwrite_refuses_a_quarantine_entry_the_job_did_not_write_and_deletes_nothing(tmp, listed):
    out = tmp / "out"
    run_convert(
        "--source", "csv", "--input", _csv(tmp, "v1", [1, 2, "x"]), "--output", out, "--max_bad_fraction", "0.5"
    )
    victim = write_text(tmp / "victim.txt", "the user's own data")
    listed = victim if listed == _OUTSIDE else listed
    _edit_metadata(out, lambda d: d["quarantine"]["files"].append({"path": listed, "records": 1}))
    before = _snapshot(tmp)
    with pytest.raises(ConversionError, match=rf"names {re.escape(repr(listed))} as a file of the dataset.*nothing"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v2", [4]), "--output", out, "--overwrite")
    after = _snapshot(tmp)
    assert {k: v for k, v in after.items() if not k.startswith("in/v2")} == before


def test_overwrite_refuses_an_old_shard_name_holding_a_pattern(tmp):
    # Beam's FileSystems.delete takes each path for a glob: 'train-*' would match the new shards.
    out = tmp / "out"
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2, 3]), "--output", out)
    os.rename(out / "train-00000-of-00001.tfrecord", out / "train-*.tfrecord")
    _edit_metadata(out, lambda d: d["splits"][0]["shards"][0].update(filename="train-*.tfrecord"))
    with pytest.raises(ConversionError, match=r"names 'train-\*\.tfrecord' as a file of the dataset"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v2", [4]), "--output", out, "--overwrite")
    assert sorted(os.listdir(out)) == ["dataset_info.json", "train-*.tfrecord", "train-00000-of-00001.tfrecord.index"]


@pytest.mark.parametrize("entry", ["old_files", "moves"])
def test_recovering_an_abandoned_commit_refuses_paths_outside_the_dataset(tmp, entry):
    out = tmp / "out"
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1, 2, 3]), "--output", out)
    victim = write_text(tmp / "victim.txt", "the user's own data")
    metadata = json.loads(open(out / contract.METADATA_FILENAME).read())
    if entry == "old_files":  # a commit that had swapped the metadata: its old files go
        plan = {"moves": [], "metadata": json.dumps(metadata), "old_files": ["../victim.txt"]}
    else:  # a commit that had not: the files it moved in go
        metadata["source"]["job"] = "another"
        plan = {"moves": [["x", "../victim.txt"]], "metadata": json.dumps(metadata), "old_files": []}
    temp = _marker(out, "0123456789ab", pid=_dead_pid())
    write_text(os.path.join(temp, output_dir.COMMIT_FILE), json.dumps(plan))
    with pytest.raises(ConversionError, match=r"commit\.json names '\.\./victim\.txt' as a file of the dataset"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v2", [4]), "--output", out, "--overwrite")
    assert open(victim).read() == "the user's own data" and os.path.isdir(temp)
    assert _values(out) == [1, 2, 3]


def test_a_temp_dir_named_by_a_pattern_is_refused_and_no_other_temp_dir_is_touched(tmp):
    out = tmp / "out"
    _marker(out, "*", pid=_dead_pid())  # _ingest_tmp-*: as a pattern it names every temp dir
    live = _marker(out, "live0000")
    before = _snapshot(live)
    with pytest.raises(ConversionError, match=r"_ingest_tmp-\*/, a conversion temp dir without a readable job\.json"):
        run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out)
    assert _snapshot(live) == before


def test_a_dead_jobs_temp_dir_is_removed_without_following_its_links(tmp):
    out = tmp / "out"
    elsewhere = write_text(tmp / "elsewhere" / "keep.txt", "the user's own data")
    temp = _marker(out, "0123456789ab", pid=_dead_pid())
    os.symlink(tmp / "elsewhere", os.path.join(temp, "fragments", "link"))
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", [1]), "--output", out)
    assert not os.path.exists(temp) and open(elsewhere).read() == "the user's own data"


def test_a_literal_pattern_matches_its_path_alone():
    from apache_beam.io.filesystem import FileSystem

    path = "gs://b/ds/train-*?[x]{y}.tfrecord"
    regex = re.compile(FileSystem.translate_pattern(output_dir.literal_pattern(path)))
    assert regex.fullmatch(path)
    assert not regex.fullmatch("gs://b/ds/train-00000-of-00001x.tfrecord")
    assert not regex.fullmatch("gs://b/ds/train-ab[x]{y}.tfrecord")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as the output needs root")
def test_a_full_disk_names_the_path_and_the_fix(tmp):
    small = tmp / "small"
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        src = _csv(tmp, "big", [f"{i}.{i % 997:03d}" for i in range(60_000)])  # ~0.7 MB of records
        with pytest.raises(
            Exception, match=r"no space left on the device holding .*small/out/_ingest_tmp-\w+ .*free space there"
        ):
            run_convert("--source", "csv", "--input", src, "--output", small / "out")
        assert not os.path.exists(small / "out" / contract.METADATA_FILENAME)
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.parametrize("old_quarantine", [True, False])
def test_overwrite_never_deletes_or_writes_through_a_symlinked_quarantine(tmp, old_quarantine):
    # Its names are the job's own, but the folder leads out of --output: deleting the old
    # quarantine would remove the user's file there, and the new one would be written there.
    out = tmp / "out"
    values = [1, 2, "x"] if old_quarantine else [1, 2, 3]
    run_convert("--source", "csv", "--input", _csv(tmp, "v1", values), "--output", out, "--max_bad_fraction", "0.5")
    os.makedirs(tmp / "elsewhere")
    if old_quarantine:
        os.rename(out / "quarantine" / "part-00000-of-00001.jsonl", tmp / "elsewhere" / "part-00000-of-00001.jsonl")
        os.rmdir(out / "quarantine")
    os.symlink(tmp / "elsewhere", out / "quarantine")
    before = _snapshot(tmp / "elsewhere")
    with pytest.raises(
        ConversionError, match=r"out/quarantine is a link to .*elsewhere: .*nothing was deleted or written"
    ):
        run_convert(
            "--source", "csv", "--input", _csv(tmp, "v2", [4, "y"]), "--output", out, "--overwrite",
            "--max_bad_fraction", "0.9",
        )  # fmt: skip
    assert _snapshot(tmp / "elsewhere") == before and _values(out) == [v for v in values if v != "x"]
