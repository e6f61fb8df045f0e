"""make_dataset on real converted datasets: values, counts, order, state, sharding, faults."""

from __future__ import annotations

import logging
import math
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ingest
from tests.conftest import convert_table, read_examples, run_convert, write_text

N = 1000


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    """1000 rows with an id, in 8 shards."""
    root = tmp_path_factory.mktemp("tabular")
    src = write_text(root / "in" / "a.csv", "id,x,y\n" + "".join(f"{i},{i / 4},{i % 3}\n" for i in range(N)))
    run_convert("--source", "csv", "--input", src, "--output", root / "ds", "--label", "y", "--num_shards", "8")
    return str(root / "ds")


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """Every dtype and shape, with missing values, from Parquet."""
    root = tmp_path_factory.mktemp("typed")
    rng = np.random.default_rng(0)
    n = 300
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "i": pa.array([None if k % 7 == 0 else int(k) * 3 for k in range(n)], pa.int64()),
            "f": pa.array([None if k % 5 == 0 else k / 8 for k in range(n)], pa.float32()),
            "s": pa.array([None if k % 11 == 0 else f"s{k}" for k in range(n)], pa.string()),
            "vec": pa.array([[k, k + 0.5, -k] for k in range(n)], pa.list_(pa.float32(), 3)),
            "tags": pa.array([[f"t{j}" for j in range(k % 4)] for k in range(n)], pa.list_(pa.string())),
            "ints": pa.array([list(rng.integers(0, 9, size=k % 6)) for k in range(n)], pa.list_(pa.int64())),
        }
    )
    return convert_table(root, table, "--num_shards", "3")


def _ids(ds, key="id"):
    out = []
    for batch in ds:
        features = batch[0] if isinstance(batch, tuple) else batch
        out.extend(features[key].numpy().tolist())
    return out


def test_values_read_back_equal_what_conversion_wrote(typed):
    ds = ingest.make_dataset(typed, batch_size=64, shuffle=False)
    reference = {r["id"][0]: r for r in read_examples(typed)}
    seen = 0
    for batch in ds:
        for k in range(int(batch["id"].shape[0])):
            ref = reference[int(batch["id"][k])]
            assert int(batch["i"][k]) == (ref["i"][0] if "i" in ref else 0)  # missing -> recorded default
            assert math.isclose(float(batch["f"][k]), ref["f"][0] if "f" in ref else 0.0)
            assert batch["s"][k].numpy() == (ref["s"][0] if "s" in ref else b"")
            assert batch["vec"][k].numpy().tolist() == ref["vec"]
            assert batch["tags"][k].numpy().tolist() == ref["tags"]
            assert batch["ints"][k].numpy().tolist() == ref["ints"]
            seen += 1
    assert seen == 300
    spec = ds.element_spec
    assert isinstance(spec["tags"], tf.RaggedTensorSpec) and spec["vec"].shape.as_list() == [None, 3]


def test_padded_and_static_shapes_are_fully_defined(typed):
    ds = ingest.make_dataset(typed, batch_size=32, drop_remainder=True, static_shapes=True, pad_lengths={"ints": 2})
    for name, spec in ds.element_spec.items():
        assert spec.shape.is_fully_defined(), name
    batch = next(iter(ds))
    assert batch["tags"].shape == (32, 3) and batch["ints"].shape == (32, 2)  # recorded max 3; given 2 truncates
    with pytest.raises(ValueError, match="static_shapes=True needs drop_remainder=True"):
        ingest.make_dataset(typed, batch_size=32, static_shapes=True)


def test_label_pairs_and_epoch_counts(tabular):
    ds = ingest.make_dataset(tabular, batch_size=64, num_epochs=2)
    assert isinstance(ds.element_spec, tuple)
    assert int(ds.cardinality()) == math.ceil(2 * N / 64)
    ids = _ids(ds)
    assert len(ids) == 2 * N and sorted(ids) == sorted(list(range(N)) * 2)
    ds = ingest.make_dataset(tabular, batch_size=64, drop_remainder=True)
    assert int(ds.cardinality()) == N // 64 == sum(1 for _ in ds)
    plain = ingest.make_dataset(tabular, batch_size=64, label=False)
    assert "y" in plain.element_spec


def test_shuffling_changes_order_but_not_content(tabular):
    a = _ids(ingest.make_dataset(tabular, batch_size=100, seed=1))
    b = _ids(ingest.make_dataset(tabular, batch_size=100, seed=2))
    ordered = _ids(ingest.make_dataset(tabular, batch_size=100, shuffle=False, deterministic=True))
    assert a != b and sorted(a) == sorted(b) == list(range(N))
    assert sorted(ordered) == list(range(N))


def test_a_seed_makes_two_runs_identical_across_epochs(tabular):
    runs = [_ids(ingest.make_dataset(tabular, batch_size=50, seed=7, num_epochs=2)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][:N] != runs[0][N:]  # each epoch reshuffles


@pytest.mark.parametrize("symbolic", [False, True])
def test_checkpoint_restores_mid_epoch_to_the_next_element(tabular, tmp_path, symbolic):
    def make():
        opts = ingest.ReadOptions(symbolic_checkpoint=symbolic)
        return ingest.make_dataset(tabular, batch_size=10, seed=3, deterministic=True, options=opts)

    full = _ids(make())
    it = iter(make())
    first = [next(it)[0]["id"].numpy().tolist() for _ in range(37)]
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.save(str(tmp_path / "ckpt"))
    it2 = iter(make())
    tf.train.Checkpoint(iterator=it2).restore(path)
    rest = [b[0]["id"].numpy().tolist() for b in it2]
    assert sum(first, []) + sum(rest, []) == full


def test_input_context_shards_files_so_every_record_is_read_once(tabular):
    ids = []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i, num_replicas_in_sync=3)
        ds = ingest.make_dataset(tabular, batch_size=32, input_context=ctx)
        part = _ids(ds)
        assert int(ds.cardinality()) == math.ceil(len(part) / 32)
        ids += part
    assert sorted(ids) == list(range(N))


def test_too_few_files_fall_back_to_record_sharding_with_a_warning(tmp_path, caplog):
    src = write_text(tmp_path / "in" / "a.csv", "id\n" + "".join(f"{i}\n" for i in range(100)))
    run_convert("--source", "csv", "--input", src, "--output", tmp_path / "ds", "--num_shards", "2")
    ids = []
    with caplog.at_level(logging.WARNING, logger="ingest.pipeline._dataset"):
        for i in range(3):
            ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
            ids += _ids(ingest.make_dataset(str(tmp_path / "ds"), batch_size=8, input_context=ctx))
    assert sorted(ids) == list(range(100))
    assert "sharding by record instead of by file" in caplog.text and "--num_shards >= 3" in caplog.text


@pytest.mark.parametrize("cache", ["memory", "auto", "file"])
def test_cache_modes_yield_the_same_records_every_epoch(tabular, tmp_path, cache):
    arg = str(tmp_path / "cache" / "c") if cache == "file" else cache
    if cache == "file":
        os.makedirs(tmp_path / "cache")
    ids = _ids(ingest.make_dataset(tabular, batch_size=100, num_epochs=3, cache=arg, seed=1))
    assert sorted(ids) == sorted(list(range(N)) * 3)
    if cache == "file":
        assert any(n.startswith("c") for n in os.listdir(tmp_path / "cache"))


def test_cache_path_that_cannot_be_written_is_refused_before_building(tabular, tmp_path):
    with pytest.raises(ValueError, match=r"cache directory .*missing does not exist"):
        ingest.make_dataset(tabular, batch_size=8, cache=str(tmp_path / "missing" / "c"))


def test_preprocess_runs_on_batches(tabular):
    def scale(x, y):
        x = dict(x)
        x["x"] = x["x"] * 4
        return x, y

    ds = ingest.make_dataset(tabular, batch_size=N, preprocess=scale, shuffle=False, deterministic=True)
    x, _ = next(iter(ds))
    assert sorted(x["x"].numpy().tolist()) == [float(i) for i in range(N)]


def _corrupt_copy(src, dst, *, truncate: bool):
    shutil.copytree(src, dst)
    info = ingest.load_info(str(dst))
    victim = os.path.join(dst, info.split("train").shards[2].filename)
    data = bytearray(open(victim, "rb").read())
    if truncate:
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    open(victim, "wb").write(bytes(data))
    return victim


@pytest.mark.parametrize("truncate", [False, True])
def test_corrupt_shard_is_an_error_naming_the_file(tabular, tmp_path, truncate):
    victim = _corrupt_copy(tabular, tmp_path / "ds", truncate=truncate)
    streaming = ingest.ReadOptions(seekable_order=False)
    ds = ingest.make_dataset(str(tmp_path / "ds"), batch_size=64, options=streaming)
    # A truncated shard is short; a corrupt one of the recorded size has other bytes than
    # the conversion fingerprinted at its ends (this small shard is all ends).
    named = r"corrupt, truncated or unreadable" if truncate else r"is not the file the conversion wrote.*corrupt"
    with pytest.raises(tf.errors.OpError, match=os.path.basename(victim) + ".*" + named + r".*skip_corrupt=True"):
        _ids(ds)
    # The seekable order (the default on blocks) refuses both as it is built, naming the shard.
    named = r"shorter than its metadata says" if truncate else named
    with pytest.raises(ValueError, match=os.path.basename(victim) + ".*" + named):
        ingest.make_dataset(str(tmp_path / "ds"), batch_size=64)


@pytest.mark.parametrize("truncate", [False, True])
def test_skip_corrupt_skips_counts_and_does_not_hang(tabular, tmp_path, truncate):
    victim = _corrupt_copy(tabular, tmp_path / "ds", truncate=truncate)
    before = ingest.skipped_corrupt_records().get(victim, 0)
    ids = _ids(ingest.make_dataset(str(tmp_path / "ds"), batch_size=64, skip_corrupt=True))
    lost = N - len(ids)
    assert 0 < lost < N / 8 and len(set(ids)) == len(ids)
    assert ingest.skipped_corrupt_records()[victim] - before == lost


def test_not_a_dataset_and_incomplete_dataset_are_refused(tmp_path, tabular):
    with pytest.raises(ingest.DatasetNotFoundError, match=r"does not exist.*beam_jobs\.convert"):
        ingest.make_dataset(str(tmp_path / "nope"), batch_size=8)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ingest.DatasetNotFoundError, match=r"is not a converted dataset.*beam_jobs\.convert"):
        ingest.load_info(str(tmp_path / "empty"))
    shutil.copytree(tabular, tmp_path / "partial")
    os.remove(tmp_path / "partial" / "dataset_info.json")
    with pytest.raises(ingest.DatasetNotFoundError, match=r"incomplete dataset.*did not finish.*Rerun"):
        ingest.make_dataset(str(tmp_path / "partial"), batch_size=8)


def test_skip_corrupt_and_symbolic_checkpoints_do_not_mix(tabular):
    with pytest.raises(ValueError, match=r"skip_corrupt=True needs tf.data's ignore_errors.*symbolic_checkpoint=False"):
        ingest.make_dataset(
            tabular, batch_size=8, skip_corrupt=True, options=ingest.ReadOptions(symbolic_checkpoint=True)
        )


def test_bad_arguments_fail_before_the_graph_is_built(tabular):
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        ingest.make_dataset(tabular, batch_size=0)
    with pytest.raises(ValueError, match=r"no split 'eval'.*splits: \['train'\]"):
        ingest.make_dataset(tabular, batch_size=8, split="eval")
    with pytest.raises(ValueError, match=r"features \['nope'\] do not exist.*features: \['id', 'x', 'y'\]"):
        ingest.make_dataset(tabular, batch_size=8, features=["nope"])
    with pytest.raises(ValueError, match=r"label 'z' is not a feature"):
        ingest.make_dataset(tabular, batch_size=8, label="z")
    with pytest.raises(ValueError, match=r"num_epochs must be a positive integer or None"):
        ingest.make_dataset(tabular, batch_size=8, num_epochs=0)
    with pytest.raises(
        ValueError, match=r"ReadOptions.cycle_length must be an integer >= 1 or None \(automatic\), got 0"
    ):
        ingest.ReadOptions(cycle_length=0)


def test_a_misspelt_feature_label_or_pad_length_is_answered_with_the_nearest_name(tabular):
    features = r"features: \['id', 'x', 'y'\]"
    with pytest.raises(ValueError, match=rf"features \['idd'\] \(did you mean 'id'\?\) do not exist in .*{features}"):
        ingest.make_dataset(tabular, batch_size=8, features=["idd"])
    with pytest.raises(ValueError, match=rf"label 'Y' \(did you mean 'y'\?\) is not a feature of .*{features}"):
        ingest.make_dataset(tabular, batch_size=8, label="Y")
    with pytest.raises(ValueError, match=r"pad_lengths names 'ID' \(did you mean 'id'\?\), which is not a feature"):
        ingest.make_dataset(tabular, batch_size=8, pad_lengths={"ID": 3})
    with pytest.raises(
        ValueError, match=r"no split 'trian' in this dataset; splits: \['train'\] \(did you mean 'train'\?\)"
    ):
        ingest.make_dataset(tabular, batch_size=8, split="trian")
    with pytest.raises(ValueError, match=r"label 'zzz' is not a feature"):  # nothing near: no guess
        ingest.make_dataset(tabular, batch_size=8, label="zzz")


def test_mirrored_strategy_trains_with_model_fit(tabular):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    ds = ingest.distribute(strategy, tabular, global_batch_size=64, features=["x"], num_epochs=None, seed=0)
    with strategy.scope():
        inputs = tf.keras.Input(shape=(), name="x")
        outputs = tf.keras.layers.Dense(3)(tf.keras.layers.Reshape((1,))(inputs))
        model = tf.keras.Model(inputs, outputs)
        model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, epochs=1, steps_per_epoch=5, verbose=0)
    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="not divisible by the 2 replicas"):
        ingest.distribute(strategy, tabular, global_batch_size=33)


def test_distribute_per_replica_batches_under_mirrored_strategy(tabular):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = ingest.distribute(strategy, tabular, global_batch_size=64, static_shapes=True, shuffle=False)
    batch = next(iter(ds))
    per_replica = strategy.experimental_local_results(batch[1])
    assert [int(t.shape[0]) for t in per_replica] == [32, 32]


def test_a_feature_name_given_as_a_string_is_one_name(tabular):
    features, _ = next(iter(ingest.make_dataset(tabular, batch_size=4, features="id")))
    assert list(features) == ["id"]


def test_a_file_given_as_the_dataset_is_named_a_file(tmp_path):
    src = write_text(tmp_path / "a.csv", "a\n1\n")
    with pytest.raises(ingest.DatasetNotFoundError, match=r"a\.csv is a file, not a converted dataset"):
        ingest.make_dataset(src, batch_size=4)


def test_a_cache_mode_typo_is_refused_not_taken_for_a_file_here(tabular, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"cache='mem' is neither None, 'memory' nor 'auto'"):
        ingest.make_dataset(tabular, batch_size=4, cache="mem")
    assert os.listdir(tmp_path) == []
    os.makedirs("c")
    ids = _ids(ingest.make_dataset(tabular, batch_size=100, cache="./c/cache", seed=1))
    assert sorted(ids) == list(range(N)) and os.listdir("c")
