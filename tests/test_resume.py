"""Iterator checkpoints on the blocks layout: a few KB, and a restore yields exactly the next batches.

The order of every epoch is a pure function of (seed, epoch); `tf.train.Checkpoint(iterator=it)`
saves the position. Restores run in a fresh process (tests/resume_child.py), against the
batches the uninterrupted iterator yields in this one.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ingest
from tests.conftest import convert_table

ROWS, BATCH, K = 4096, 64, 128  # 64 batches an epoch, 32 blocks
EPOCH = ROWS // BATCH


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(3)
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "x": rng.random(ROWS).astype(np.float32),
            "tags": pa.array([["a"] * (i % 3) for i in range(ROWS)], pa.list_(pa.string())),
            "y": rng.integers(0, 3, ROWS),
        }
    )
    root = tmp_path_factory.mktemp("resume")
    return convert_table(root, table, "--num_shards", "4", "--block_rows", str(K), "--label", "y")


def _ids(batch) -> list:
    features = batch[0] if isinstance(batch, tuple) else batch
    return features["id"].numpy().tolist()


def _size(prefix: str) -> int:
    folder = os.path.dirname(prefix)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f != "checkpoint")


def _restore_in_a_fresh_process(preloaded, path, kwargs, checkpoints, batches) -> list:
    """In a process of its own, forked before any TensorFlow op ran (tests/_preloaded.py)."""
    spec = {"path": path, "kwargs": kwargs, "checkpoints": checkpoints, "batches": batches}
    out = preloaded.run(["tests/resume_child.py", json.dumps(spec)], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _uninterrupted(ds, total: int) -> list:
    out = []
    for batch in ds:
        out.append(_ids(batch))
        if len(out) == total:
            break
    return out


@pytest.mark.slow
@pytest.mark.parametrize("num_epochs", [None, 3])
def test_a_restored_iterator_yields_exactly_the_next_batches_in_a_fresh_process(
    dataset, tmp_path, num_epochs, preloaded
):
    kwargs = {"batch_size": BATCH, "num_epochs": num_epochs}  # no seed: one is drawn and kept in the state
    ds = ingest.make_dataset(dataset, **kwargs)
    stops = [5, EPOCH, EPOCH + 37]  # mid-epoch, on the epoch boundary, in a later epoch
    it = iter(ds)
    ckpt = tf.train.Checkpoint(iterator=it)
    stream, prefixes = [], []
    for stop in stops:
        while len(stream) < stop:
            stream.append(_ids(next(it)))
        prefixes.append(ckpt.write(str(tmp_path / f"at-{stop}" / "ckpt")))
    total = 3 * EPOCH
    stream += [_ids(b) for _, b in zip(range(total - len(stream)), it)]
    assert len(stream) == total and sorted(sum(stream[:EPOCH], [])) == list(range(ROWS))

    restored = _restore_in_a_fresh_process(preloaded, dataset, kwargs, prefixes, 40)
    for stop, got in zip(stops, restored):
        assert got == stream[stop : stop + 40], stop
        assert _size(prefixes[stops.index(stop)]) <= 64 * 1024


def test_each_epoch_is_a_permutation_and_each_pass_a_new_order(dataset):
    ds = ingest.make_dataset(dataset, batch_size=BATCH, num_epochs=2, seed=9)
    first = sum(_uninterrupted(ds, 2 * EPOCH), [])
    assert sorted(first[:ROWS]) == sorted(first[ROWS:]) == list(range(ROWS)) and first[:ROWS] != first[ROWS:]
    second = sum(_uninterrupted(ds, 2 * EPOCH), [])
    assert second != first  # a second pass over the same dataset reshuffles (Keras re-iterates each epoch)
    again = sum(_uninterrupted(ingest.make_dataset(dataset, batch_size=BATCH, num_epochs=2, seed=9), 2 * EPOCH), [])
    assert again == first  # and a seed reproduces the run


@pytest.mark.parametrize("block_window", [None, 1, 32])
def test_the_checkpoint_is_under_a_kilobyte_whatever_the_window(dataset, tmp_path, block_window):
    ds = ingest.make_dataset(dataset, batch_size=BATCH, options=ingest.ReadOptions(block_window=block_window))
    it = iter(ds)
    for _ in range(7):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    assert _size(prefix) < 1024
    # The streaming order's checkpoint holds its buffers: several times larger even on 4k rows.
    streaming = ingest.make_dataset(dataset, batch_size=BATCH, options=ingest.ReadOptions(seekable_order=False))
    it = iter(streaming)
    for _ in range(7):
        next(it)
    big = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "streaming" / "ckpt"))
    assert _size(big) > 3 * _size(prefix)


def test_the_checkpoint_is_the_position_five_numbers(dataset, tmp_path):
    it = iter(ingest.make_dataset(dataset, batch_size=BATCH, seed=5))
    for _ in range(7):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    (key,) = [k for k in reader.get_variable_to_shape_map() if k.startswith("iterator/")]
    version, _, seed, _, batch = reader.get_tensor(key).tolist()
    assert (version, seed, batch) == (1, 5, 7) and key.endswith("position")
    assert _size(prefix) < 1024


def _first_ids(batch) -> list:
    return batch.numpy().tolist() if isinstance(batch, tf.Tensor) else _ids(batch)


def test_a_position_restores_through_map_and_prefetch_and_counts_in_tf_functions(dataset, tmp_path):
    def make():
        ds = ingest.make_dataset(dataset, batch_size=BATCH, seed=11, num_epochs=None)
        return ds.map(lambda f, y: f["id"]).prefetch(2)

    @tf.function
    def step(iterator):  # passed as an argument, as Keras and custom loops pass it
        return next(iterator)

    @tf.function
    def optional(iterator):  # as Keras's steps take it
        return iterator.get_next_as_optional().get_value()

    it = iter(make())
    taken = [next(it), step(it), step(it), optional(it), next(it), optional(it)]
    whole = [b.numpy().tolist() for _, b in zip(range(EPOCH + 20), make())]
    assert [_first_ids(b) for b in taken] == whole[:6]
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    for _ in range(EPOCH):  # on past the epoch's end
        step(it)
    again = iter(make())
    tf.train.Checkpoint(iterator=again).read(prefix).assert_consumed()
    assert [_first_ids(step(again)) for _ in range(3)] + [_first_ids(next(again))] == whole[6:10]
    assert [_first_ids(b) for b in (step(it), next(it))] == whole[EPOCH + 6 : EPOCH + 8]


def test_past_a_stage_that_is_not_one_batch_per_batch_tf_data_checkpoints_the_iterator(dataset, tmp_path):
    def make():
        ds = ingest.make_dataset(dataset, batch_size=BATCH, seed=11, num_epochs=None)
        return ds.filter(lambda f, y: tf.size(y) > 0)  # a filter: its count is no position

    it = iter(make())
    for _ in range(3):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    expected = [_ids(next(it)) for _ in range(3)]
    again = iter(make())
    tf.train.Checkpoint(iterator=again).read(prefix)
    assert [_ids(next(again)) for _ in range(3)] == expected


def test_a_checkpoint_before_the_first_batch_restores_a_fresh_iterator(dataset, tmp_path):
    kwargs = dict(batch_size=BATCH, seed=11, num_epochs=None)
    prefix = tf.train.Checkpoint(iterator=iter(ingest.make_dataset(dataset, **kwargs))).write(str(tmp_path / "ck"))
    again = iter(ingest.make_dataset(dataset, **kwargs))  # as a restarted run restores before its first batch
    tf.train.Checkpoint(iterator=again).read(prefix)
    assert [_ids(next(again)) for _ in range(3)] == _uninterrupted(ingest.make_dataset(dataset, **kwargs), 3)
    # Restored into an iterator that has taken batches: it starts a pass afresh, as a new iter() would.
    used = iter(ingest.make_dataset(dataset, **kwargs))
    next(used)
    tf.train.Checkpoint(iterator=used).read(prefix)
    assert sorted(sum((_ids(next(used)) for _ in range(EPOCH)), [])) == list(range(ROWS))


def test_two_iterators_restored_at_once_over_one_dataset_raise_instead_of_swapping(dataset, tmp_path):
    ds = ingest.make_dataset(dataset, batch_size=BATCH, seed=11, num_epochs=None)
    it = iter(ds)
    for _ in range(3):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    first, second = iter(ds), iter(ds)
    tf.train.Checkpoint(iterator=first).read(prefix)
    tf.train.Checkpoint(iterator=second).read(prefix)
    with pytest.raises(RuntimeError, match=r"two iterators over one make_dataset dataset were restored"):
        next(first)


@pytest.mark.slow
def test_two_input_pipelines_each_resume_and_together_read_every_row_once(dataset, tmp_path, preloaded):
    stream, prefixes, restored = {}, {}, {}
    for i in range(2):
        kwargs = {"batch_size": 32, "num_epochs": 1, "input_context": [2, i]}
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i)
        it = iter(ingest.make_dataset(dataset, batch_size=32, num_epochs=1, input_context=ctx))
        stream[i] = [_ids(next(it)) for _ in range(11)]
        prefixes[i] = tf.train.Checkpoint(iterator=it).write(str(tmp_path / f"p{i}" / "ckpt"))
        stream[i] += [_ids(b) for b in it]
        restored[i] = _restore_in_a_fresh_process(preloaded, dataset, kwargs, [prefixes[i]], 10_000)[0]
        assert restored[i] == stream[i][11:]
    rows = sum(stream[0], []) + sum(stream[1], [])
    assert sorted(rows) == list(range(ROWS))
    assert not set(sum(stream[0], [])) & set(sum(stream[1], []))


def _fixed_layout(root, values, *args) -> str:
    """One shard of 32-row blocks whose byte layout depends on the row order only through
    the shuffle: ids take 1 or 2 varint bytes, and every block's payload stays under 128 bytes."""
    table = pa.table({"id": np.arange(2000), "v": np.full(2000, values, np.int64)})
    return convert_table(root, table, "--num_shards", "1", "--block_rows", "32", *args)


def test_a_checkpoint_of_a_dataset_laid_out_alike_is_refused(tmp_path):
    a, b = _fixed_layout(tmp_path / "a", 1), _fixed_layout(tmp_path / "b", 2)
    shards = [ingest.load_info(d).split("train").shards[0] for d in (a, b)]
    assert (shards[0].filename, shards[0].bytes) == (shards[1].filename, shards[1].bytes)
    it = iter(ingest.make_dataset(a, batch_size=BATCH, seed=1))
    next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    other = iter(ingest.make_dataset(b, batch_size=BATCH, seed=1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"restored from a checkpoint of another dataset"):
        tf.train.Checkpoint(iterator=other).read(prefix)
        next(other)


def test_a_dataset_reconverted_in_place_is_read_at_its_new_block_offsets(tmp_path):
    path = _fixed_layout(tmp_path, 1, "--seed", "1")
    before = ingest.load_info(path).split("train").shards[0]
    first = open(os.path.join(path, before.filename), "rb").read()
    # Runs of one block: each read starts at its block's own offset.
    kwargs = dict(batch_size=BATCH, seed=1, options=ingest.ReadOptions(block_run=32))
    assert sorted(sum((_ids(b) for b in ingest.make_dataset(path, **kwargs)), [])) == list(range(2000))
    for seed in ("2", "3"):  # the second --overwrite gives the shard its first name back
        _fixed_layout(tmp_path, 1, "--seed", seed, "--overwrite")
    after = ingest.load_info(path).split("train").shards[0]
    assert (after.filename, after.bytes) == (before.filename, before.bytes)
    assert open(os.path.join(path, after.filename), "rb").read() != first  # other block boundaries
    assert sorted(sum((_ids(b) for b in ingest.make_dataset(path, **kwargs)), [])) == list(range(2000))


def _in_ingests_words(error, pattern: str) -> None:
    """ingest's sentence alone: not TensorFlow's three lines around it (DeserializeIterator, the
    iterator's stages, the assert's node, "Make sure the dataset definition has not changed")."""
    assert "\n" not in error.message and "DeserializeIterator" not in error.message, error.message
    assert "Make sure" not in error.message and "{{node" not in error.message, error.message
    assert re.match(pattern, error.message), error.message


@pytest.mark.slow
def test_a_checkpoint_restored_with_another_seed_is_refused_and_without_one_takes_its_seed(dataset, tmp_path):
    """A seed given is the order asked for: a checkpoint of another seed would resume in its own order
    (it did, silently: seed=2 restored seed 1's next batches). seed=None restores the checkpoint's."""
    it = iter(ingest.make_dataset(dataset, batch_size=BATCH, seed=1))
    next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    rest = [_ids(b) for b in it]
    other = iter(ingest.make_dataset(dataset, batch_size=BATCH, seed=2))
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        tf.train.Checkpoint(iterator=other).restore(prefix)  # as CheckpointManager.restore_or_initialize does
        next(other)
    _in_ingests_words(
        e.value, r"^this iterator was restored from a checkpoint saved with seed 1 into make_dataset\(seed=2\) "
    )
    unseeded = iter(ingest.make_dataset(dataset, batch_size=BATCH))
    tf.train.Checkpoint(iterator=unseeded).read(prefix)
    assert [_ids(b) for b in unseeded] == rest
    same = iter(ingest.make_dataset(dataset, batch_size=BATCH, seed=1))
    tf.train.Checkpoint(iterator=same).read(prefix)
    assert [_ids(b) for b in same] == rest


def test_a_checkpoint_of_another_batch_size_or_dataset_is_refused(dataset, tmp_path):
    it = iter(ingest.make_dataset(dataset, batch_size=BATCH, seed=1))
    next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    other = iter(ingest.make_dataset(dataset, batch_size=BATCH * 2, seed=1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"restored from a checkpoint of another dataset") as e:
        tf.train.Checkpoint(iterator=other).read(prefix)  # refused as it restores (the window is recomputed)
        next(other)
    _in_ingests_words(e.value, rf"^this iterator .* with batch_size={BATCH * 2}: .*without the checkpoint\.$")

    # The same rows converted again (another shuffle): blocks at other offsets.
    reconverted = convert_table(
        tmp_path / "again",
        pa.table({"id": np.arange(ROWS), "x": np.zeros(ROWS, np.float32)}),
        "--num_shards",
        "4",
        "--block_rows",
        str(K),
    )
    moved = iter(ingest.make_dataset(reconverted, batch_size=BATCH, seed=1, label=False))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Restore it into the make_dataset call it was saved"):
        tf.train.Checkpoint(iterator=moved).read(prefix)
        next(moved)


def test_without_shuffle_the_order_is_the_shards_in_turn(dataset):
    ids = sum(_uninterrupted(ingest.make_dataset(dataset, batch_size=BATCH, shuffle=False), EPOCH), [])
    info = ingest.load_info(dataset)
    assert sorted(ids) == list(range(ROWS))
    # Shard by shard: the first shard's rows come first, in the order written.
    first = info.split("train").shards[0].records
    records = tf.data.TFRecordDataset(os.path.join(dataset, info.split("train").shards[0].filename))
    from ingest.pipeline.blocks.parse import parse_blocks

    spec = [f for f in info.features if f.name == "id"]
    written = parse_blocks(tf.stack(list(records)), spec)["id"].numpy().tolist()
    assert ids[:first] == written


def _killed_and_resumed(preloaded, script: str, args, tmp_path) -> None:
    """Runs `script` whole, then killed after step 25 and run again: both must end with the
    same weights. `args(directory, die_after, out, name)` gives its arguments; `name` is
    the run's: whole, killed or resumed. Each run is a process of its own, forked before
    any TensorFlow op ran (tests/_preloaded.py)."""

    def run(directory, die_after, out, name):
        return preloaded.run([script, *args(directory, die_after, out, name)], timeout=300)

    whole = run(tmp_path / "whole", 0, tmp_path / "whole.npy", "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run(tmp_path / "killed", 25, tmp_path / "killed.npy", "killed")
    assert killed.returncode == 3 and not (tmp_path / "killed.npy").exists(), killed.stderr[-3000:]
    resumed = run(tmp_path / "killed", 0, tmp_path / "killed.npy", "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "killed.npy"), np.load(tmp_path / "whole.npy"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_training_killed_mid_epoch_resumes_to_the_same_weights(dataset, tmp_path, mode, preloaded):
    """The README's recipe: killed after step 25 (last checkpoint at 20), rerun, it ends where an
    uninterrupted run ends: the same batches were trained on, in the same order. `graph`: each
    step takes its batch in a tf.function given the iterator (the position counts there)."""
    steps = EPOCH + 30  # crosses an epoch
    _killed_and_resumed(
        preloaded,
        "tests/train_resume_child.py",
        lambda d, die, out, _: [dataset, str(d), str(steps), str(die), str(out), mode],
        tmp_path,
    )


_STARTS = [0, 5, EPOCH - 1, EPOCH + 3, 3 * EPOCH + 10]
_WHOLE: dict = {}  # dataset -> its seed-11 stream, as far as the last start needs


@pytest.mark.parametrize("start", _STARTS)
def test_start_batch_seeks_to_that_batch_of_the_stream(dataset, start):
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=11)
    if dataset not in _WHOLE:  # made once for the five starts: a build and a pass each was half their time
        _WHOLE[dataset] = _uninterrupted(ingest.make_dataset(dataset, **kwargs), max(_STARTS) + 12)
    whole = _WHOLE[dataset][: start + 12]
    assert _uninterrupted(ingest.make_dataset(dataset, start_batch=start, **kwargs), 12) == whole[start:]


@pytest.mark.slow
def test_tf_data_symbolic_checkpoints_when_asked_give_the_same_batches_and_seek_by_start_batch(dataset, tmp_path):
    # The default checkpoints the iterator's position, with tf.data's symbolic checkpoints off
    # (they cost a third to a half of the rate); asked for, tf.data's take over.
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=11)
    symbolic = ingest.ReadOptions(symbolic_checkpoint=True)
    default = ingest.make_dataset(dataset, **kwargs)
    slow = ingest.make_dataset(dataset, options=symbolic, **kwargs)
    assert default.options().experimental_symbolic_checkpoint is False
    assert slow.options().experimental_symbolic_checkpoint is True
    whole = _uninterrupted(default, EPOCH + 20)
    assert _uninterrupted(slow, EPOCH + 20) == whole
    assert (
        _uninterrupted(ingest.make_dataset(dataset, start_batch=EPOCH + 3, options=symbolic, **kwargs), 17)
        == whole[EPOCH + 3 :]
    )
    it = iter(slow)
    for _ in range(5):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "symbolic" / "ckpt"))
    assert _size(prefix) < 16 * 1024
    expected = [_ids(next(it)) for _ in range(3)]  # of the dataset's second pass
    again = iter(ingest.make_dataset(dataset, options=symbolic, **kwargs))
    tf.train.Checkpoint(iterator=again).read(prefix)
    assert [_ids(next(again)) for _ in range(3)] == expected
    # Other graphs keep symbolic checkpoints off unless asked: the rows layout's streaming order.
    streaming = ingest.make_dataset(dataset, batch_size=BATCH, options=ingest.ReadOptions(seekable_order=False))
    assert streaming.options().experimental_symbolic_checkpoint is False


def test_start_batch_from_a_variable_is_read_when_the_iterator_is_created(dataset):
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=11)
    whole = _uninterrupted(ingest.make_dataset(dataset, **kwargs), 40)
    position = tf.Variable(0, dtype=tf.int64)
    ds = ingest.make_dataset(dataset, start_batch=position, **kwargs)
    position.assign(30)  # after the dataset was built, before its iterator
    assert _uninterrupted(ds, 10) == whole[30:]


def test_start_batch_from_a_variable_is_read_when_the_iterator_makes_its_first_batch(dataset):
    # Not when iter() makes it: a counter that the step taking the first batch adds to
    # (a Keras optimizer's iterations) would be read before or after its increment.
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=11)
    whole = _uninterrupted(ingest.make_dataset(dataset, **kwargs), 40)
    position = tf.Variable(0, dtype=tf.int64)
    it = iter(ingest.make_dataset(dataset, start_batch=position, **kwargs))
    position.assign(30)
    assert [_ids(next(it)) for _ in range(10)] == whole[30:]


def test_fit_start_holds_the_step_fit_started_at_while_fit_runs(dataset):
    import keras

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(7)  # as BackupAndRestore leaves it, before fit's first epoch
    start, held = ingest.FitStart(), []

    class Held(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            held.append(int(start.step))

    ds = ingest.make_dataset(dataset, batch_size=BATCH, num_epochs=None, features=["x"], label="y", seed=11)
    ds = ds.map(lambda f, y: (tf.reshape(f["x"], [-1, 1]), tf.cast(y, tf.float32)))
    model.fit(ds, epochs=2, steps_per_epoch=3, callbacks=[Held(), start], verbose=0)
    assert held == [7, 7, 7, 10, 10, 10] and int(model.optimizer.iterations) == 13


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 2])
def test_start_batch_with_finite_epochs_yields_the_rest_of_the_stream(dataset, epochs):
    kwargs = dict(batch_size=BATCH, num_epochs=epochs, seed=11)
    whole = [_ids(b) for b in ingest.make_dataset(dataset, **kwargs)]
    assert len(whole) == epochs * EPOCH
    for start in (5, epochs * EPOCH - 1, epochs * EPOCH, epochs * EPOCH + 3):
        ds = ingest.make_dataset(dataset, start_batch=start, **kwargs)
        assert int(ds.cardinality()) == max(epochs * EPOCH - start, 0)
        assert [_ids(b) for b in ds] == whole[start:]
    position = tf.Variable(0, dtype=tf.int64)
    ds = ingest.make_dataset(dataset, start_batch=position, **kwargs)
    position.assign(7)
    assert [_ids(b) for b in ds] == whole[7:]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_epochs=1),
        dict(num_epochs=None),
        dict(num_epochs=None, options=ingest.ReadOptions(canonical_pipelines=2)),
    ],
    ids=["one_epoch", "endless", "canonical"],
)
@pytest.mark.parametrize("taken", [1, 5, EPOCH + 2])
def test_a_checkpoint_of_an_iterator_started_from_a_variable_restores_where_it_was(dataset, tmp_path, kwargs, taken):
    # The start is read once, when the iterator is made: restored later (the step counter
    # has moved on), the iterator continues from the saved position, not from the counter.
    position = tf.Variable(3, dtype=tf.int64)
    ds = ingest.make_dataset(dataset, batch_size=BATCH, seed=11, start_batch=position, **kwargs)
    it = iter(ds)
    for _ in range(min(taken, EPOCH - 8) if kwargs["num_epochs"] == 1 else taken):  # 3 left after
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    expected = [_ids(next(it)) for _ in range(3)]
    position.assign(40)
    again = iter(ds)
    tf.train.Checkpoint(iterator=again).read(prefix)
    assert [_ids(next(again)) for _ in range(3)] == expected


@pytest.mark.parametrize("how", ["make_dataset", "distribute"])
def test_a_negative_start_read_from_a_variable_is_refused(dataset, how):
    position = tf.Variable(0, dtype=tf.int64)
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=11)
    if how == "make_dataset":
        ds, name = ingest.make_dataset(dataset, start_batch=position, **kwargs), "start_batch"
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        kwargs["global_batch_size"] = kwargs.pop("batch_size")
        ds, name = ingest.distribute(strategy, dataset, start_step=position, **kwargs), "start_step"
    position.assign(-3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{name} must be >= 0"):
        next(iter(ds))


def test_more_canonical_partitions_than_blocks_are_refused_when_built(dataset):
    blocks = sum(s.blocks for s in ingest.load_info(dataset).split("train").shards)
    assert 4 < blocks < 40  # in 4 shards
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=1)
    with pytest.raises(ValueError, match=rf"canonical_pipelines=64 is more than the split.s {blocks} blocks"):
        ingest.make_dataset(dataset, **kwargs, options=ingest.ReadOptions(canonical_pipelines=64))


def test_start_batch_is_refused_where_it_cannot_seek(dataset):
    with pytest.raises(ValueError, match=r"start_batch needs a seed"):
        ingest.make_dataset(dataset, batch_size=BATCH, start_batch=3)
    with pytest.raises(ValueError, match=r"start_batch needs the blocks layout's seekable order"):
        ingest.make_dataset(
            dataset, batch_size=BATCH, seed=1, start_batch=3, options=ingest.ReadOptions(seekable_order=False)
        )
    with pytest.raises(ValueError, match=r"start_batch must be a non-negative int"):
        ingest.make_dataset(dataset, batch_size=BATCH, seed=1, start_batch=-1)


def _batch_lines(path) -> list:
    """The batches a keras_resume_child run logged, as their first ids: one per line."""
    with open(path) as f:
        return [line.strip().strip("[]").split() for line in f if line.strip()]


@pytest.mark.slow
def test_keras_fit_killed_mid_epoch_resumes_to_the_same_weights(dataset, tmp_path, preloaded):
    """The README's Keras recipe: BackupAndRestore every 10 batches, killed after step 25 of
    an epoch of 16 (so mid-epoch, past a backup at 20), rerun: the weights of an
    uninterrupted fit, and every step trained on batch N of the stream (N = its step - 1).
    Without `start_batch` the rerun reads the stream from its start; with
    `start_batch=model.optimizer.iterations` the start was read as the first step added 1
    to it (skipping batch 0, or 20 after the restore, or not, as the threads ran)."""
    _killed_and_resumed(
        preloaded,
        "tests/keras_resume_child.py",
        lambda d, die, out, name: [dataset, str(d), "3", "16", str(die), str(out), str(tmp_path / f"{name}.ids")],
        tmp_path,
    )
    stream = _batch_lines(tmp_path / "whole.ids.stream")
    assert len(stream) == 48 and len({tuple(b) for b in stream}) == 48
    assert _batch_lines(tmp_path / "resumed.ids.stream") == stream  # the same order in every run
    assert _batch_lines(tmp_path / "whole.ids")[:48] == stream
    assert _batch_lines(tmp_path / "killed.ids")[:25] == stream[:25]
    assert _batch_lines(tmp_path / "resumed.ids")[:28] == stream[20:]


@pytest.mark.slow
def test_distribute_resumes_at_a_global_step_under_mirrored_strategy(dataset):
    # tf.distribute's iterators cannot be checkpointed (tensorflow/tensorflow#56372): a run
    # resumes from the step its checkpoint holds. Two replicas (logical CPUs) fed by one
    # input pipeline, which gives two batches a step.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    step = tf.Variable(0, dtype=tf.int64)

    def steps(ds, n):
        it = iter(ds)
        return [[_ids({"id": t}) for t in strategy.experimental_local_results(next(it)["id"])] for _ in range(n)]

    def build(**kwargs):
        return ingest.distribute(
            strategy, dataset, global_batch_size=2 * BATCH, label=False, num_epochs=None, seed=3, **kwargs
        )

    uninterrupted = steps(build(), 45)  # an epoch is 32 steps: the resumes cross its end
    assert sorted(sum(sum(uninterrupted[:32], []), [])) == list(range(ROWS))
    assert steps(build(start_step=step), 5) == uninterrupted[:5]
    resumed = build(start_step=step)  # as a restarted run builds it, before its checkpoint is read
    step.assign(13)  # as the restored checkpoint does: read when the iterator is made
    assert steps(resumed, 20) == uninterrupted[13:33]
    assert steps(build(start_step=30), 15) == uninterrupted[30:45]
    with pytest.raises(ValueError, match="start_step needs a seed"):
        ingest.distribute(strategy, dataset, global_batch_size=2 * BATCH, start_step=3)
    with pytest.raises(ValueError, match="takes start_step .global steps., not start_batch"):
        build(start_batch=3)
    with pytest.raises(ValueError, match="start_step must be a non-negative int or a scalar integer variable"):
        build(start_step=-1)


@pytest.mark.slow
def test_canonical_partitions_give_the_same_global_batches_for_any_number_of_pipelines(dataset):
    # Elastic resume: 4 canonical partitions. A run on 2 input pipelines stops at step 37;
    # it resumes on 4 pipelines, or on 1, at that step, with the same global batch size:
    # every global batch holds the same rows, so the rest of the epoch comes exactly once.
    options = ingest.ReadOptions(canonical_pipelines=4)

    def global_batches(pipelines, steps, start=None):
        streams = []
        for j in range(pipelines):
            ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=j)
            ds = ingest.make_dataset(
                dataset,
                batch_size=BATCH // pipelines,
                label=False,
                num_epochs=None,
                seed=11,
                options=options,
                start_batch=start,
                input_context=ctx if pipelines > 1 else None,
            )
            streams.append(_uninterrupted(ds, steps))
        return [sorted(sum(parts, [])) for parts in zip(*streams)]

    two = global_batches(2, EPOCH + 20)
    assert all(len(b) == BATCH for b in two)
    # Each partition (a shard here, of ~1000 rows, 16 a batch) ends its epoch at its own
    # step: until the first of them no row twice, and by the last every row.
    shard_rows = [s.records for s in ingest.load_info(dataset).split("train").shards]
    assert len(shard_rows) == 4
    first, last = min(shard_rows) // (BATCH // 4), -(-max(shard_rows) // (BATCH // 4))
    assert len(set(sum(two[:first], []))) == first * BATCH
    assert set(sum(two[:last], [])) == set(range(ROWS))
    assert global_batches(4, EPOCH + 20 - 37, start=37) == two[37:]
    assert global_batches(1, 30) == two[:30]
    # Not a fixed order: the batches are mixed, and an epoch is not the one before.
    assert two[0] != sorted(range(BATCH)) and two[0] != sorted(two[EPOCH])


@pytest.mark.slow
def test_canonical_partitions_checkpoint_like_any_iterator(dataset, tmp_path):
    def make():
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
        options = ingest.ReadOptions(canonical_pipelines=4)
        return ingest.make_dataset(dataset, batch_size=32, num_epochs=None, seed=2, options=options, input_context=ctx)

    it = iter(make())
    for _ in range(70):  # past the end of the partitions' first epochs
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    assert _size(prefix) < 64 * 1024
    expected = [_ids(next(it)) for _ in range(10)]
    restored = iter(make())
    tf.train.Checkpoint(iterator=restored).read(prefix).assert_consumed()
    assert [_ids(next(restored)) for _ in range(10)] == expected


def test_canonical_partitions_refuse_what_cannot_be_elastic(dataset):
    options = ingest.ReadOptions(canonical_pipelines=4)
    ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=0)
    kwargs = dict(batch_size=BATCH, num_epochs=None, seed=1, options=options)
    with pytest.raises(ValueError, match=r"canonical_pipelines=4 is not a multiple of the 3 input pipelines"):
        ingest.make_dataset(dataset, **{**kwargs, "input_context": ctx})
    with pytest.raises(ValueError, match=r"batch_size 66 is not divisible by the 4 canonical partitions"):
        ingest.make_dataset(dataset, **{**kwargs, "batch_size": 66})
    with pytest.raises(ValueError, match=r"canonical_pipelines needs a seed"):
        ingest.make_dataset(dataset, **{**kwargs, "seed": None})
    with pytest.raises(ValueError, match=r"canonical_pipelines needs num_epochs=None"):
        ingest.make_dataset(dataset, **{**kwargs, "num_epochs": 2})
    with pytest.raises(ValueError, match=r"canonical_pipelines needs the blocks layout's seekable order"):
        ingest.make_dataset(dataset, **{**kwargs, "cache": "memory"})
