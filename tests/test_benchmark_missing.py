"""benchmarks.missing runs: masks against fill, on a table with missing values."""

from __future__ import annotations

import pytest

import ingest
from benchmarks import missing


@pytest.mark.slow
def test_the_missing_benchmark_masks_half_the_features_and_measures_both_settings(tmp_path, capsys):
    dataset = missing.ensure_dataset(str(tmp_path), 20_000)
    info = ingest.load_info(dataset)
    masked = [f.name for f in info.features if f.missing]
    assert 0 < len(masked) < len(info.features) and info.label not in masked
    rates = missing.measure(dataset, 1024, rounds=2, steady_rows=8192)
    assert {k: len(v) for k, v in rates.items()} == {"mask": 2, "fill": 2}
    assert all(r > 0 for v in rates.values() for r in v)
