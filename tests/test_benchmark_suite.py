"""The benchmark suite runs end to end in quick mode (CI proves it works; speed is not asserted)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from benchmarks import suite


@pytest.mark.slow
def test_quick_suite_writes_results_table_and_plots(tmp_path):
    # One run a pipeline: the verdicts' weighing of repeated runs is tested on given numbers
    # (tests/test_benchmark_noise.py); this proves the suite runs end to end.
    # At a fraction of --quick's sizes (50k rows, 80 steps, 300 images: 75 s of CPU).
    results = suite.run(
        str(tmp_path / "out"), quick=True, workdir=str(tmp_path / "data"), repeats=1, rows=20_000, steps=40, images=64
    )
    written = json.load(open(tmp_path / "out" / "results.json"))
    assert written == results
    pairs = {(r["scenario"], r["pipeline"]) for r in results}
    for name in ("naive", "csv_direct", "parquet_direct", "best_practice", "tuned_by_hand", "make_dataset"):
        assert ("formats", name) in pairs
    assert ("prefetch", "without_prefetch") in pairs and ("cache", "make_dataset") in pairs
    assert ("cache", "best_practice") in pairs and ("cache", "make_dataset cache=None") in pairs
    assert {("images", name) for name in ("naive", "hand_written", "make_dataset")} <= pairs
    assert "formats: make_dataset" in suite.verdicts(results)
    sweeps = {r["pipeline"]: r for r in results if r["scenario"] == "layouts"}
    assert set(sweeps) == {"make_dataset, rows", "make_dataset, blocks"}
    for r in sweeps.values():  # steps from long to short, stopping at the first over 1% idle
        steps = [s for s, _ in r["sweep"]]
        assert steps == sorted(steps, reverse=True) and all(i <= suite.IDLE_TARGET for _, i in r["sweep"][:-1])
    from benchmarks import slowfs

    slow = [r for r in results if r["scenario"] == "slow_storage"]
    if slowfs.unavailable_reason() is None:
        assert [r["pipeline"] for r in slow] == [
            "make_dataset cycle_length=1",
            "make_dataset cycle_length=4",
            "make_dataset cycle_length=16",
            "make_dataset cycle_length=16 num_parallel_calls=16",
            "best_practice",
            "tuned_by_hand",
            "make_dataset",
        ]
        assert not os.path.ismount(tmp_path / "out" / "slow-mount")  # unmounted afterwards
    else:
        assert slow == [{"scenario": "slow_storage", "pipeline": "unavailable", "reason": slowfs.unavailable_reason()}]
    for r in results:
        if r["pipeline"] == "unavailable" or "sweep" in r:
            continue
        assert {"scenario", "pipeline", "idle_fraction", "examples_per_sec", "step_time_ms", "steps"} <= set(r)
        assert 0 <= r["idle_fraction"] <= 1 and r["steps"] > 0 and r["examples_per_sec"] > 0
    for png in ("idle_by_scenario.png", "wait_timeline.png", "layouts_sweep.png"):
        with open(tmp_path / "out" / png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "| formats | make_dataset |" in suite.table(results)


@pytest.mark.slow
def test_quick_conversion_benchmark_reports_every_comparison(tmp_path):
    from benchmarks import conversion

    # --quick's parts at a fifth of its sizes: the same comparisons, ~4x sooner.
    small = ["--rows", "20000", "--runs", "1", "--naive_rows", "5000", "--mp_rows", "20000", "--mp_runs", "1"]
    small += ["--rss_rows", "5000,20000"]
    assert conversion.main([*small, "--workdir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    results = json.load(open(tmp_path / "out" / "conversion.json"))
    encoders = [r["encoder"] for r in results["encoder"]]
    assert encoders[:3] == [
        "ingest (encode_record_batch)",
        "ingest, framed as TFRecords (+CRC32C)",
        "protobuf object per row (first batch)",
    ]
    assert all(r["bytes_per_row"] > 300 for r in results["encoder"])  # the same records, whichever encoder
    assert [(r["converter"], r["text"]) for r in results["job"]] == [
        ("naive", "low"),
        ("job_csv", "low"),
        ("job_parquet", "low"),
        ("job_csv --layout rows", "low"),
        ("job_parquet --layout rows", "low"),
        ("naive", "high"),
        ("job_csv", "high"),
        ("job_parquet", "high"),
    ]
    # Timed, not compared: on 20k rows a loaded machine ran a whole job faster than its median 1-row one.
    assert results["startup_s"] > 0 and all(r["seconds"] > 0 for r in results["job"] if r["converter"] != "naive")
    assert [r["workers"] for r in results["multiprocess"]] == [1, 2]
    assert all(r["peak_rss_mb"] > 0 and r["workers_cpu_s"] > 0 for r in results["multiprocess"])
    assert [r["rows"] for r in results["rss"]] == [5000, 20000]


@pytest.mark.slow
def test_quick_runtime_smooth_and_startup_benchmarks_report_every_pipeline(tmp_path, preloaded, monkeypatch):
    from benchmarks import _measure, runtime, smooth, startup

    def forked(module, *args):
        # The start-up children time from after their imports; forked after them
        # (tests/_preloaded.py), each skips TensorFlow's import (~6 s of CPU) and times the same.
        child = preloaded.run(["-m", module, *map(str, args)], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert child.returncode == 0, child.stderr[-2000:]
        return json.loads(child.stdout.strip().splitlines()[-1])

    monkeypatch.setattr(_measure, "run_child", forked)

    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    small = ["--rows", "20000", "--workdir", data, "--out", out]  # --quick's 50k rows take 2.5x as long
    assert runtime.main([*small, "--epochs", "1", "--naive_epochs", "1", "--no_rss"]) == 0
    throughput = json.load(open(tmp_path / "out" / "runtime.json"))["throughput"]
    assert sorted(throughput) == ["256", "4096"]
    for rows in throughput.values():
        by_name = {r["pipeline"]: r for r in rows}
        assert by_name["parquet_in_memory"]["vs_parquet_in_memory"] == 1.0
        assert {"make_dataset, blocks", "hand_tuned_rows", "naive"} <= set(by_name)
        assert all(r["examples_per_sec"] > 0 for r in rows)
    assert smooth.main([*small, "--runs", "1", "--epochs", "2"]) == 0
    smoothness = json.load(open(tmp_path / "out" / "smooth.json"))
    assert [r["batch_size"] for r in smoothness] == [256, 4096]
    assert all(0 <= r["idle_pct"] <= 100 and r["step_ms"] > r["producer_ms"] > 0 for r in smoothness)
    assert startup.main([*small, "--runs", "1"]) == 0
    rows = json.load(open(tmp_path / "out" / "startup.json"))["rows"]
    assert [r["pipeline"] for r in rows] == ["make_dataset", "hand_tuned_rows", "parquet_in_memory"]
    assert all(r["fresh_process_s"] > 0 and r["new_iterator_s"] > 0 for r in rows)


@pytest.mark.slow
def test_images_benchmark_measures_the_stored_for_training_datasets_against_the_records_baseline(tmp_path):
    from benchmarks import images

    small = ["--images", "40", "--large_images", "2", "--runs", "1", "--batches", "2", "--warmup_batches", "1"]
    assert images.main([*small, "--workdir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    results = json.load(open(tmp_path / "out" / "images.json"))
    rows = {(r["corpus"], r["pipeline"]): r for r in results["input"]}
    stored = {"make_dataset, raw 256", "make_dataset, JPEG 256 q90"}
    assert {p for c, p in rows if c == "500x375"} == {
        "naive (Pillow loop)",
        "hand-written tf.data",
        "tf.data, TFRecords",
        "make_dataset",
    } | stored
    assert rows[("500x375", "tf.data, TFRecords")]["vs_records"] == 1.0
    assert all(r["images_per_sec"] > 0 and r["per_core"] > 0 and r["bytes_per_image"] > 0 for r in rows.values())
    # Independent of the timing: 256x192 RGB pixels (and a few hundred bytes of features) per raw image.
    assert 256 * 192 * 3 < rows[("500x375", "make_dataset, raw 256")]["bytes_per_image"] < 256 * 192 * 3 + 1024
    assert [r["conversion"] for r in results["stored"]] == [" ".join(f) for f in images.STORED.values()]
    with pytest.raises(SystemExit, match=r"--cores must be 1\.\.\d+"):
        images.pin_cores(10**6)


def test_scaling_ceiling_has_make_datasets_shape_and_rows():
    # The synthetic pipeline benchmarks.scaling reports as tf.data's ceiling: whole
    # batches of the numeric corpus' columns, every window's rows once.
    from benchmarks import corpus, scaling

    window = 81_920  # 20 batches of 4096
    batches = list(scaling.ceiling(4096, 3 * window - 100, cores=2))  # three windows
    assert len(batches) == 3 * window // 4096
    features, label = batches[0]
    assert sorted(features) == sorted(corpus.FLOAT_COLS + corpus.INT_COLS)
    assert all(t.shape == (4096,) for t in features.values()) and label.shape == (4096,)
    for w in range(3):  # the label is the window's permutation: each row once
        labels = np.concatenate([b[1].numpy() for b in batches[w * 20 : (w + 1) * 20]])
        assert sorted(labels) == list(range(window))
    endless = list(scaling.ceiling(256, None, cores=1).take(3 * window // 256 + 1))  # past 3 windows
    assert len(endless) == 3 * window // 256 + 1 and endless[-1][1].shape == (256,)
