"""make_dataset's option objects and request: ImageOptions, ReadOptions (and its old name), the cache decision."""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import ingest
from ingest.pipeline import _request, _tuning
from tests.conftest import run_convert, write_text

MB = 2**20


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """12 JPEGs in two classes, in 2 shards."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(12):
        folder = root / "in" / ("cat" if i % 2 else "dog")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), "RGB").save(folder / f"{i}.jpg", "JPEG")
    run_convert("--source", "images", "--input", root / "in", "--output", root / "ds", "--num_shards", "2")
    return str(root / "ds")


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabular")
    src = write_text(root / "in" / "a.csv", "id,x,y\n" + "".join(f"{i},{i / 4},{i % 3}\n" for i in range(100)))
    run_convert("--source", "csv", "--input", src, "--output", root / "ds", "--label", "y", "--num_shards", "2")
    return str(root / "ds")


def _epoch(ds):
    images, labels = zip(*((x.numpy(), y.numpy()) for x, y in ds))
    return np.concatenate(images), np.concatenate(labels)


# ImageOptions


def test_image_options_yield_the_same_batches_as_the_flat_keywords(images):
    flat = ingest.make_dataset(
        images,
        batch_size=5,
        image_size=(16, 24),
        training=True,
        channels=1,
        image_dtype="bfloat16",
        normalize=((0.5,), (0.25,)),
        seed=7,
    )
    opts = ingest.ImageOptions(size=(16, 24), training=True, channels=1, dtype="bfloat16", normalize=((0.5,), (0.25,)))
    grouped = ingest.make_dataset(images, batch_size=5, image=opts, seed=7)
    (x1, y1), (x2, y2) = _epoch(flat), _epoch(grouped)
    assert x1.shape == (12, 16, 24, 1) and str(x1.dtype) == "bfloat16"
    np.testing.assert_array_equal(x1.astype(np.float32), x2.astype(np.float32))
    np.testing.assert_array_equal(y1, y2)


def test_image_options_defaults_are_the_flat_keywords_defaults(images):
    x1, _ = _epoch(ingest.make_dataset(images, batch_size=4, image_size=(8, 8), seed=1))
    x2, _ = _epoch(ingest.make_dataset(images, batch_size=4, image=ingest.ImageOptions(size=(8, 8)), seed=1))
    assert x1.dtype == np.float32 and 0.0 <= x1.min() and x1.max() <= 1.0  # float32, "unit"
    np.testing.assert_array_equal(x1, x2)


def test_giving_image_options_both_ways_is_refused_naming_the_keywords(images):
    opts = ingest.ImageOptions(size=(8, 8))
    with pytest.raises(ValueError, match=r"image options given twice: .*\['channels', 'training'\].*one or the other"):
        ingest.make_dataset(images, batch_size=4, image=opts, training=False, channels=3)
    with pytest.raises(ValueError, match=r"\['image_size'\]"):
        ingest.make_dataset(images, batch_size=4, image=opts, image_size=(8, 8))
    with pytest.raises(ValueError, match=r"\['normalize'\]"):
        ingest.make_dataset(images, batch_size=4, image=opts, normalize=None)


def test_image_must_be_image_options_and_only_for_image_datasets(images, tabular):
    with pytest.raises(ValueError, match=r"image must be an ingest.ImageOptions, got tuple"):
        ingest.make_dataset(images, batch_size=4, image=(8, 8))
    with pytest.raises(ValueError, match=r"for image datasets; .* holds no images \(features: \['id', 'x', 'y'\]\)"):
        ingest.make_dataset(tabular, batch_size=4, image=ingest.ImageOptions(size=(8, 8)))
    with pytest.raises(ValueError, match=r"is an image dataset: give image_size=\(height, width\) \(or image=ingest"):
        ingest.make_dataset(images, batch_size=4)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(size=(0, 8)), r"image size must be positive, got \(0, 8\)"),
        (dict(size=224), r"image size must be \(height, width\), got 224"),
        (
            dict(size=(8, 8), training="yes"),
            r"training must be True, False or None \(True for the shuffled train split\), got 'yes'",
        ),
        (dict(size=(8, 8), channels=4), r"channels must be 1 \(grayscale\) or 3 \(RGB\), got 4"),
        (dict(size=(8, 8), dtype="float16"), r"dtype must be one of \['bfloat16', 'float32', 'uint8'\], got 'float16'"),
        (dict(size=(8, 8), dtype="uint8", normalize="unit"), r"'uint8' keeps pixel values 0-255: use normalize=None"),
        (dict(size=(8, 8), channels=1, normalize="imagenet"), r"normalize='imagenet' needs channels=3.*got channels=1"),
        (dict(size=(8, 8), normalize=((0.5,), (0.2,))), r"needs 3 values each and positive std"),
        (dict(size=(8, 8), normalize=((0.5,) * 3, (0.2, 0.0, 0.2))), r"needs 3 values each and positive std"),
        (dict(size=(8, 8), normalize=("ab", "cd")), r"normalize=\(mean, std\) needs two sequences of numbers"),
        (dict(size=(8, 8), normalize="z-score"), r"must be None, 'unit', 'imagenet' or \(mean, std\), got 'z-score'"),
    ],
)
def test_image_options_check_themselves_when_built(kwargs, error):
    with pytest.raises(ValueError, match=error):
        ingest.ImageOptions(**kwargs)


def test_image_options_are_frozen_hashable_and_normalize_their_inputs():
    a = ingest.ImageOptions(size=[np.int64(32), 48], normalize=[[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]])
    b = ingest.ImageOptions(size=(32, 48), normalize=((0.5,) * 3, (0.25,) * 3))
    assert a == b and hash(a) == hash(b) and a.size == (32, 48)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.size = (1, 1)
    # "default" follows the dtype, also after replace(): uint8 stays 0-255, floats go to [0, 1].
    floats = ingest.ImageOptions(size=(8, 8))
    assert floats.scale and floats.mean_std is None
    assert not dataclasses.replace(floats, dtype="uint8").scale
    assert ingest.ImageOptions(size=(8, 8), normalize="imagenet").mean_std[0] == (0.485, 0.456, 0.406)


# ReadOptions and its deprecated name


def test_pipeline_options_is_a_deprecated_name_for_read_options_on_every_use():
    for _ in range(2):  # not only the first access: the alias is not cached as a module global
        with pytest.warns(DeprecationWarning, match=r"ingest.PipelineOptions is deprecated: use ingest.ReadOptions"):
            assert ingest.PipelineOptions is ingest.ReadOptions
    with pytest.warns(DeprecationWarning, match="PipelineOptions"):
        from ingest import PipelineOptions
    assert PipelineOptions(cycle_length=2) == ingest.ReadOptions(cycle_length=2)
    assert "PipelineOptions" not in ingest.__all__ and {"ReadOptions", "ImageOptions"} <= set(ingest.__all__)


def test_the_new_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ingest.ReadOptions(prefetch=0)
        ingest.ImageOptions(size=(8, 8))


def test_read_options_errors_name_the_class_and_field(tabular):
    with pytest.raises(ValueError, match=r"ReadOptions.shuffle_buffer must be an integer >= 1 or None .*, got -1"):
        ingest.ReadOptions(shuffle_buffer=-1)
    with pytest.raises(ValueError, match=r"ReadOptions.block_run must be an integer >= 1 or None .*, got 0"):
        ingest.ReadOptions(block_run=0)
    with pytest.raises(ValueError, match=r"options must be an ingest.ReadOptions, got dict"):
        ingest.make_dataset(tabular, batch_size=4, options={"cycle_length": 2})


def test_tf_data_autotune_is_off_by_default_and_on_when_asked_with_the_same_batches(tabular):
    kwargs = dict(batch_size=4, shuffle=True, seed=5)
    plain = ingest.make_dataset(tabular, **kwargs)
    tuned = ingest.make_dataset(tabular, options=ingest.ReadOptions(autotune=True), **kwargs)
    assert plain.options().autotune.enabled is False
    assert tuned.options().autotune.enabled is True
    flat = [tf.nest.map_structure(lambda t: t.numpy().tolist(), b) for b in plain]
    assert flat == [tf.nest.map_structure(lambda t: t.numpy().tolist(), b) for b in tuned]
    with pytest.raises(ValueError, match=r"ReadOptions.autotune must be a bool, got 'yes'"):
        ingest.ReadOptions(autotune="yes")


# The request


def test_request_resolves_defaults_once(tabular, images):
    req = _request.build(tabular, batch_size=8, seed=3, shuffle=True)
    assert req.label == "y" and req.features == ("id", "x", "y")
    assert req.deterministic  # a seed asks for reproducibility
    assert not _request.build(tabular, batch_size=8).deterministic
    assert req.options == ingest.ReadOptions() and req.path == tabular.rstrip("/")
    assert _request.build(tabular + "/", label=False).label is None
    assert _request.build(tabular, features=["x"]).features == ("x", "y")  # the label comes along
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.batch_size = 16
    # Serialized records of an image dataset: nothing to decode, so no image options needed.
    assert _request.build(images, raw=True).image is None
    image = _request.build(images, image=ingest.ImageOptions(size=(8, 8)))  # build's default: shuffle=False
    assert image.image == ingest.ImageOptions(size=(8, 8), training=False)
    assert image.features == ("image/encoded", "image/class/label")
    shuffled = _request.build(images, image=ingest.ImageOptions(size=(8, 8)), shuffle=True)
    assert shuffled.image == ingest.ImageOptions(size=(8, 8), training=True)


def test_request_counts_only_when_every_record_is_expected_here(tabular):
    assert _request.build(tabular).checks_counts
    assert not _request.build(tabular, skip_corrupt=True).checks_counts
    assert not _request.build(tabular, service="localhost:5050").checks_counts
    assert _request.build(tabular, service="localhost:5050").service == "grpc://localhost:5050"
    assert _request.build(tabular, num_pipelines=2, pipeline_id=1).sharded


def test_request_from_read_records_needs_no_batching_arguments(tabular):
    from ingest.pipeline._dataset import read_records

    info = ingest.load_info(tabular)
    # Records as stored: blocks of rows on the default layout.
    records = sum(s.blocks if info.layout == "blocks" else s.records for s in info.split("train").shards)
    assert sum(1 for _ in read_records(tabular)) == records and info.split("train").records == 100


# The cache decision


def test_auto_caches_in_memory_only_with_twice_the_room():
    # Cached tensors take more memory than their serialized bytes: a 2x margin.
    assert _tuning.cache_target("auto", records_bytes=400 * MB, budget_bytes=1000 * MB) == "memory"
    assert _tuning.cache_target("auto", records_bytes=500 * MB, budget_bytes=1000 * MB) == "memory"
    assert _tuning.cache_target("auto", records_bytes=501 * MB, budget_bytes=1000 * MB) is None


def test_explicit_cache_choices_ignore_the_budget():
    for cache in (None, "memory", "/tmp/cache/records"):
        assert _tuning.cache_target(cache, records_bytes=10**12, budget_bytes=1) == cache
        assert _tuning.cache_target(cache, records_bytes=0, budget_bytes=10**12) == cache


def test_cache_budget_is_a_quarter_of_memory_unless_given():
    assert _tuning.cache_budget(16 << 30) == 4 << 30
    assert _tuning.cache_budget(16 << 30, requested=100 * MB) == 100 * MB


def test_auto_cache_over_its_budget_still_yields_every_epoch_and_logs_why(tabular, caplog):
    opts = ingest.ReadOptions(cache_budget_bytes=1)
    with caplog.at_level(logging.INFO, logger="ingest.pipeline._dataset"):
        ds = ingest.make_dataset(tabular, batch_size=10, cache="auto", shuffle=False, num_epochs=2, options=opts)
        ids = [int(v) for features, _ in ds for v in features["id"]]
    assert sorted(ids) == sorted(list(range(100)) * 2)
    assert "does not fit the 0 MB budget; not caching" in caplog.text


def _parse_map_calls(ds) -> set:
    """The num_parallel_calls of the dataset graph's parallel maps."""
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    nodes = {n.name: n for n in graph.node}
    calls = set()
    for n in graph.node:
        if n.op == "ParallelMapDatasetV2":
            const = nodes[n.input[-1].split(":")[0]]
            calls.add(int(tf.make_ndarray(const.attr["value"].tensor)))
    return calls


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 2), (8, 8), (16, 8), (64, 8)])
def test_the_seekable_order_parses_one_window_a_core_up_to_eight(tabular, monkeypatch, cpus, want):
    # On a 16-vCPU host 16 windows in flight read 4.2M rows/s where 8 read 5.7M (#37).
    from ingest.pipeline.blocks import seekable

    monkeypatch.setattr(seekable, "usable_cpus", lambda: cpus)
    assert _parse_map_calls(ingest.make_dataset(tabular, batch_size=4)) == {want}
    asked = ingest.make_dataset(tabular, batch_size=4, options=ingest.ReadOptions(num_parallel_calls=12))
    assert _parse_map_calls(asked) == {12}


def test_shards_read_at_once_count_the_cores_this_process_may_use(tmp_path, monkeypatch):
    # Two readers a core: a container given 2 of a host's 64 cores opens 4, not 128.
    from ingest.pipeline import _read

    src = write_text(tmp_path / "in" / "a.csv", "id,y\n" + "".join(f"{i},{i % 2}\n" for i in range(800)))
    out = tmp_path / "ds"
    run_convert(
        "--source", "csv", "--input", src, "--output", out, "--label", "y", "--num_shards", "16", "--layout", "rows"
    )
    for cpus, want in ((1, 2), (2, 4), (64, 16)):
        monkeypatch.setattr(_read, "usable_cpus", lambda: cpus)
        graph = tf.compat.v1.GraphDef.FromString(
            ingest.make_dataset(str(out), batch_size=4)._as_serialized_graph().numpy()
        )
        nodes = {n.name: n for n in graph.node}
        (interleave,) = [n for n in graph.node if "Interleave" in n.op]
        cycle = nodes[interleave.input[-5 if interleave.op.startswith("Parallel") else -2].split(":")[0]]
        assert int(tf.make_ndarray(cycle.attr["value"].tensor)) == want


@pytest.mark.slow
def test_the_device_probe_reports_each_variant_and_dataset(tabular, images, capsys):
    # benchmarks/device_probe.py runs on the GPU host, where nothing else checks it.
    import json

    from benchmarks import device_probe

    device_probe.main("tab", [tabular], batches=3)
    device_probe.main("img", [images], batches=2)
    tab, img = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert tab["dataset"] == tabular and all(r > 0 for r in tab["rows_per_s"].values())
    assert {"default", "4 windows at once", "reads in the window calls"} <= set(tab["rows_per_s"])
    assert list(img["images_per_s"]) == [images] and img["images_per_s"][images] > 0


@pytest.mark.slow
def test_the_device_probes_process_mode_reports_the_loader_beside_make_dataset(tabular, capsys):
    import json

    from benchmarks import device_probe

    device_probe.main("proc", [tabular], batches=3)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["batch"] for line in lines] == [4096, 256]
    assert all(r > 0 for line in lines for r in line["rows_per_s"].values())
    assert {
        "make_dataset in-graph",
        "loader, 1 worker(s)",
        "(g) 1 worker(s) into tf.data",
    } <= set(lines[0]["rows_per_s"])


@pytest.mark.slow
def test_the_device_probes_feed_mode_runs_its_loop_where_there_is_no_gpu(tabular):
    # On the GPU host it times a CUDA graph; here the same loop, eagerly on the CPU, so that
    # the one call a GPU session makes has run before.
    pytest.importorskip("torch")
    from benchmarks import device_probe

    out = device_probe.feed(tabular, 32, 8, 1, steps=3)
    assert out["device"] == "cpu" and out["workers"] == 1 and out["fed_ms"] > 0 and 0 <= out["idle"] <= 1
