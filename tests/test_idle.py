"""The idle-time meter reads what it should on pipelines of known speed."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ingest
from benchmarks.pipelines import sleep_each

PER_BATCH_MS = 20


def _paced(n, per_batch_ms=PER_BATCH_MS, prefetch=False):
    """A pipeline that produces one batch every `per_batch_ms`."""
    ds = sleep_each(tf.data.Dataset.range(n).map(lambda i: tf.fill([8], i)), per_batch_ms)
    return ds.prefetch(4) if prefetch else ds


def test_step_of_half_the_batch_time_reads_about_half_idle():
    report = ingest.measure_idle(_paced(70), step_time_ms=PER_BATCH_MS / 2, warmup_steps=10)
    assert 0.40 < report.idle_fraction < 0.60
    assert report.classification == "highly input-bound"
    assert report.steps == 60 and len(report.waits) == 70


def test_ample_headroom_reads_about_zero_idle():
    report = ingest.measure_idle(_paced(60, per_batch_ms=5, prefetch=True), step_time_ms=2 * 5 * 2, warmup_steps=10)
    assert report.idle_fraction < 0.02
    assert report.classification == "not input-bound"


def test_without_prefetch_the_load_adds_to_the_step():
    # The reference's scenario: a 200-unit step, a 150-unit load; scaled to ms/5 here.
    def load(i):
        return tf.fill([4], i)

    ds = sleep_each(tf.data.Dataset.range(40).map(load), 30)
    off = tf.data.Options()
    off.experimental_optimization.inject_prefetch = False  # TF adds a prefetch unless told not to
    no_prefetch = ingest.measure_idle(ds.with_options(off), step_time_ms=40, warmup_steps=5, depth=1)
    with_prefetch = ingest.measure_idle(ds.prefetch(2), step_time_ms=40, warmup_steps=5, depth=2)
    assert 0.35 < no_prefetch.idle_fraction < 0.50  # 30 / (30 + 40) = 43%
    assert with_prefetch.idle_fraction < 0.05


def test_report_summary_and_distributions():
    steps = iter(np.random.default_rng(0).uniform(5, 15, size=1000))
    report = ingest.measure_idle(
        _paced(30, per_batch_ms=1, prefetch=True), step_time_ms=lambda i: next(steps), warmup_steps=5
    )
    s = report.summary()
    assert s["steps"] == 25 and 5 <= s["step_time_ms"] <= 16
    assert s["examples_per_sec"] > 0 and s["wait_p99_ms"] >= s["wait_p50_ms"] >= 0
    with pytest.raises(ValueError, match="within the 10 warm-up steps"):
        ingest.measure_idle(_paced(5), step_time_ms=1)


def test_keras_train_step_consumer_measures_wait_and_step():
    x = np.random.default_rng(0).normal(size=(640, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    slow = sleep_each(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), 15)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report = ingest.measure_train_step(model, slow, warmup_steps=3)
    assert report.steps == 17
    assert np.median(report.steady_waits) > 0.012  # the 15 ms load is paid in next()
    assert report.total_step_time > report.total_wait > 0


def test_plain_python_iterables_of_numpy_batches_are_measured_too():
    import numpy as np

    batches = ((np.zeros((8, 3)), np.zeros(8)) for _ in range(12))
    report = ingest.measure_idle(batches, step_time_ms=1, warmup_steps=2)
    assert report.examples == 10 * 8 and len(report.waits) == 12  # steady-state examples; waits include warm-up
