"""Shuffle quality of both layouts at their defaults: properties, not timings (benchmarks.mixing)."""

import numpy as np
import pytest

from benchmarks import corpus, mixing


def test_the_same_batches_twice_reshare_every_pair():
    batches = mixing.batches_of(np.random.default_rng(0).permutation(10_000), 100)
    assert mixing.reshare_fraction(batches, batches) == 1.0


def test_independent_permutations_reshare_about_the_ideal_fraction():
    rng = np.random.default_rng(1)
    first, second = (mixing.batches_of(rng.permutation(20_000), 100) for _ in range(2))
    assert mixing.reshare_fraction(first, second) == pytest.approx(mixing.ideal_reshare(20_000, 100), rel=0.25)


def test_reach_in_source_order_is_one_batch_and_shuffled_is_nearly_everything():
    assert mixing.reach(mixing.batches_of(np.arange(10_000), 100), 10_000) == pytest.approx(99 / 9_999)
    assert mixing.reach(mixing.batches_of(np.random.default_rng(2).permutation(10_000), 100), 10_000) > 0.95


def test_an_incomplete_pass_is_refused():
    with pytest.raises(ValueError, match="exactly once"):
        mixing.epoch_batches([{"idx": np.array([0, 1, 1])}], "idx", rows=3)


@pytest.fixture(scope="module")
def in_source_order(tmp_path_factory):
    """The benchmark schema with a source index, 200k rows, one shard, converted with
    --no_shuffle: only the runtime mixes, so both measures see its shuffle alone."""
    work = str(tmp_path_factory.mktemp("mixing"))
    return {
        layout: corpus.ensure_dataset(work, 200_000, 1, layout=layout, shuffle=False, indexed=True)
        for layout in ("rows", "blocks")
    }


@pytest.fixture(scope="module")
def measured(in_source_order):
    return {layout: mixing.measure(path, key=corpus.INDEX, batch_size=256) for layout, path in in_source_order.items()}


@pytest.mark.slow
def test_blocks_at_their_defaults_mix_at_least_as_well_as_rows(measured):
    rows, blocks = measured["rows"], measured["blocks"]
    assert blocks["reshare"] <= rows["reshare"]
    assert blocks["reach"] >= rows["reach"]


@pytest.mark.slow
def test_both_layouts_mix_close_to_a_perfect_shuffle(measured):
    ideal = measured["rows"]["ideal_reshare"]
    assert measured["blocks"]["reshare"] <= 1.25 * ideal
    assert measured["rows"]["reshare"] <= 2 * ideal
    # Block-mates stay in one window: reading whole blocks must not narrow a batch's reach.
    assert measured["blocks"]["reach"] >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_without_shuffle_the_measures_see_the_same_batches_again(in_source_order, layout):
    m = mixing.measure(in_source_order[layout], key=corpus.INDEX, batch_size=256, shuffle=False)
    assert m["reshare"] == 1.0
    assert m["reach"] == pytest.approx(255 / 199_999)
