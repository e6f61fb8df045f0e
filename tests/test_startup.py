"""What a new iterator costs: the pipeline's own functions skip Grappler's per-iterator pass; the user's do not."""

from __future__ import annotations

import pytest
import tensorflow as tf

import ingest
from ingest.pipeline import _functions
from tests.conftest import run_convert, write_text

_ATTRIBUTE = "experimental_ints_on_device"


def _convert(root, layout: str) -> str:
    src = write_text(
        root / "in" / "a.csv", "id,x,t,y\n" + "".join(f"{i},{i / 4},w{i % 5},{i % 3}\n" for i in range(300))
    )
    blocks = ["--block_rows", "16"] if layout == "blocks" else []
    args = ["--input", src, "--output", root / "ds", "--label", "y", "--num_shards", "2", "--layout", layout]
    run_convert("--source", "csv", *args, *blocks)
    return str(root / "ds")


@pytest.fixture(scope="module", params=["blocks", "rows"])
def dataset(request, tmp_path_factory):
    return _convert(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("blocks"), "blocks")


def _functions_of(ds: tf.data.Dataset) -> dict:
    """{name: has the attribute} of the functions tf.data calls (not the conds' branches)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return {f.signature.name: _ATTRIBUTE in f.attr for f in graph.library.function if "_Dataset_" in f.signature.name}


def test_the_pipelines_functions_skip_grappler_and_a_preprocess_function_does_not(dataset):
    def mine(features, label):
        return features, label

    functions = _functions_of(ingest.make_dataset(dataset, batch_size=8, shuffle=True, preprocess=mine))
    users = [name for name in functions if "_mine_" in name]
    assert len(users) == 1 and not functions[users[0]]
    ours = {name: has for name, has in functions.items() if name not in users}
    assert len(ours) >= 3 and all(ours.values()), ours


def test_a_start_batch_variable_is_read_by_a_function_for_every_device(blocks):
    start = tf.Variable(2, dtype=tf.int64)
    ds = ingest.make_dataset(blocks, batch_size=8, shuffle=True, seed=1, start_batch=start)
    functions = _functions_of(ds)
    readers = [name for name in functions if "read_first" in name]
    assert len(readers) == 1 and not functions[readers[0]]
    assert sum(functions.values()) >= 3
    everything = ingest.make_dataset(blocks, batch_size=8, shuffle=True, seed=1)
    assert [b[1].numpy().tolist() for b in ds] == [b[1].numpy().tolist() for b in everything][2:]


def test_own_functions_nests_and_restores():
    def traced():
        return _functions_of(tf.data.Dataset.range(3).map(lambda x: x + 1))

    with _functions.own_functions():
        assert all(traced().values())
        with _functions.own_functions(False):
            assert not any(traced().values())
        assert all(traced().values())
    assert not any(traced().values())


@pytest.mark.parametrize("drop_remainder, ops", [(False, 3), (True, 2)])
def test_a_column_adds_a_split_and_a_reshape_per_part_to_a_window_batches(blocks, drop_remainder, ops):
    # 300 rows in batches of 8 end in a short batch: every column is split into its whole
    # batches and its tail, each reshaped (the tail dropped with drop_remainder). Every op
    # of the function is paid again by each new iterator, so none more is made per column.
    def window_batches_ops(features):
        ds = ingest.make_dataset(blocks, batch_size=8, features=features, drop_remainder=drop_remainder)
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(ds._as_serialized_graph().numpy())
        (count,) = [len(f.node_def) for f in graph.library.function if "window_batches" in f.signature.name]
        return count

    assert window_batches_ops(["id", "x", "t"]) - window_batches_ops(["x"]) == 2 * ops
