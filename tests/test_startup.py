"""What a new iterator costs: the pipeline's own functions skip Grappler's per-iterator pass; the user's do not."""

from __future__ import annotations

import pytest
import tensorflow as tf

import ingest
from ingest import _functions
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
