"""benchmarks.processes' pieces: its hand-off timer, and design (d) keeping make_dataset's order."""

import itertools

import numpy as np


def test_the_hand_off_timer_counts_two_copies_and_a_positive_cost():
    from benchmarks import processes

    cost = processes.handoff(256, rows=1024, columns=3, repeats=1)
    assert cost["copies"] == 2 and cost["us a batch"] > 0 and cost["ns a row"] > 0


def test_sub_pipelines_interleaved_by_window_give_make_datasets_batches(tmp_path):
    import pyarrow as pa

    from benchmarks import processes
    from tests.conftest import convert_table

    rng = np.random.default_rng(1)
    table = pa.table({"x": rng.random(5000).astype(np.float32), "y": rng.integers(0, 2, 5000)})
    path = convert_table(tmp_path, table, "--label", "y", "--block_rows", "512", "--num_shards", "2")
    # 4096-row batches of a 5,000-row split: windows of 4,096 rows straddle its epochs.
    mixed = processes._sub_pipelines(path, 4096, "strings", 2).as_numpy_iterator()
    whole = processes._made(path, 4096, "strings").as_numpy_iterator()
    for a, b in itertools.islice(zip(mixed, whole), 12):
        np.testing.assert_array_equal(a[0]["x"], b[0]["x"])
        np.testing.assert_array_equal(a[1], b[1])
