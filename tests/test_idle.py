"""The idle-time meter reads what it should on pipelines of known speed."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ingest
from benchmarks._noise import Machine
from benchmarks.pipelines import sleep_each

PER_BATCH_MS = 20


def _paced(n, per_batch_ms=PER_BATCH_MS, prefetch=False):
    """A pipeline that produces one batch every `per_batch_ms`."""
    ds = sleep_each(tf.data.Dataset.range(n).map(lambda i: tf.fill([8], i)), per_batch_ms)
    return ds.prefetch(4) if prefetch else ds


@pytest.mark.alone
def test_step_of_half_the_batch_time_reads_about_half_idle():
    report = ingest.measure_idle(_paced(70), step_time_ms=PER_BATCH_MS / 2, warmup_steps=10)
    assert 0.40 < report.idle_fraction < 0.60
    assert report.classification == "highly input-bound"
    assert report.steps == 60 and len(report.waits) == 70


@pytest.mark.alone
def test_ample_headroom_reads_about_zero_idle():
    report = ingest.measure_idle(_paced(60, per_batch_ms=5, prefetch=True), step_time_ms=2 * 5 * 2, warmup_steps=10)
    assert report.idle_fraction < 0.02
    assert report.classification == "not input-bound"


@pytest.mark.slow
@pytest.mark.alone
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


@pytest.mark.alone
def test_a_keras_step_is_timed_on_free_input_and_laid_on_the_timeline():
    x = np.random.default_rng(0).normal(size=(640, 256)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    # A step of a few ms: batches from memory (~0.05 ms) keep up with a wide margin.
    model = tf.keras.Sequential([tf.keras.Input((256,)), tf.keras.layers.Dense(1024), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    weights = [w.numpy() for w in model.weights]
    fast = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().prefetch(4)
    # Up to three tries, as for the producers above: a stall of the other test process's
    # making on the two shared cores can cost this short run a few percent.
    for _ in range(3):
        report = ingest.measure_train_step(model, fast, steps=100, warmup_steps=10)
        if report.idle_fraction < 0.05:
            break
    step = report.computes[0]
    assert report.steps == 100 and all(c == step for c in report.computes) and 0 < step < 0.5
    assert report.idle_fraction < 0.05
    # Input 4x the step's time and 10 ms more: idle ~0.8. At 2x and 5 ms (idle ~0.65) a busy
    # machine read 0.45 once, its steps then slower than the free-input timing.
    slow = sleep_each(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), 4000 * step + 10).repeat()
    idle = []
    for _ in range(2):  # a second try only when the first fell short
        idle.append(ingest.measure_train_step(model, slow, steps=30, warmup_steps=3).idle_fraction)
        if idle[-1] > 0.5:
            break
    assert max(idle) > 0.5, idle
    assert all(np.array_equal(w.numpy(), before) for w, before in zip(model.weights, weights))  # put back


def test_plain_python_iterables_of_numpy_batches_are_measured_too():
    import numpy as np

    batches = ((np.zeros((8, 3)), np.zeros(8)) for _ in range(12))
    report = ingest.measure_idle(batches, step_time_ms=1, warmup_steps=2)
    assert report.examples == 10 * 8 and len(report.waits) == 12  # steady-state examples; waits include warm-up


def _batch22():
    """A batch as a tabular pipeline gives it: 22 tensors of 256 rows."""
    return {f"f{i}": tf.zeros([256], tf.float32 if i % 2 else tf.int64) for i in range(22)}


def _producer(kind: str) -> tf.data.Dataset:
    """Batches from memory ("fast"), or each after a sleep in a tf.data thread (C++, no GIL;
    it overshoots by ~0.1 ms, which the measured speed includes)."""
    from tensorflow.python.data.experimental.ops import testing

    ds = tf.data.Dataset.from_tensors(_batch22()).repeat()
    if kind != "fast":
        ds = ds.apply(testing.sleep(int(kind[len("sleep_") : -2])))
    return ds.prefetch(8)


@pytest.mark.parametrize(
    "kind, factor",
    [
        # A step twice a sub-millisecond producer's time is thousands of steps: 9-10 s a try.
        pytest.param("fast", 2.0, marks=pytest.mark.slow),
        # Half idle at a sub-millisecond step (~0.2 ms, a dozen steps a host call). Not
        # with a 10 us sleep: its speed is the OS's wake-up (~0.1 ms a batch), which the
        # meter's own thread slows on a busy core: with the other core spinning, 3 of 6
        # tries read 0.06-0.07 above the producer's interval, and it failed every run on
        # a slower machine of this kind. A 200 us sleep: 5 of 6 within 0.013 there.
        ("sleep_200us", 0.5),
        # Nor at twice it: with the other core busy the 10 us sleep read 0.06-0.15 idle for 0
        # on three tries running (its wake-up slowed mid-try), the 200 us one within the bound.
        pytest.param("sleep_200us", 2.0, marks=pytest.mark.slow),
        # Over 5 s on a busy 2-core machine; 200 us at 0.5 and 1 ms at 2.0 stay quick.
        pytest.param("sleep_1000us", 0.5, marks=pytest.mark.slow),
        ("sleep_1000us", 2.0),
        pytest.param("sleep_25000us", 0.5, marks=pytest.mark.slow),
        pytest.param("sleep_25000us", 2.0, marks=pytest.mark.slow),
    ],
)
@pytest.mark.alone
def test_the_meter_reads_the_analytic_idle_of_producers_of_known_speed(kind, factor):
    """A producer's per-batch time P, measured in the graph; a device step of factor * P
    idles max(0, 1 - factor) of the time. Steps from ~0.06 ms to ~50 ms."""
    from ingest.inspection._idle import batch_time_ms

    batches = max(40, int(300 / _nominal_ms(kind)))
    warmup = min(256, batches)  # the prefetch's 8 filled, and more: 256 of 25 ms were 6.4 s of each timing
    errors, crowded = [], []
    # Up to five tries that had a core to themselves: the other core may be busy (a spin
    # loop, the other test process), but a try during which other processes took more
    # than one core (a test's worker processes: three busy processes on two cores slowed
    # a 1 ms producer ~3x mid-try and read 0.25-0.47 idle for 0 on every try of a run) does
    # not count, and up to six such are tried again. Five, not three: with the other test
    # process bursting (within one core on average) a 1 ms producer read 0.088, 0.065 and
    # 0.054 idle for 0 on three tries running. A meter with a floor of its own (the old
    # next() per batch read 0.39 for 0) is off on every try that counts.
    while len(errors) < 5 and len(crowded) < 6:
        start = Machine.read()
        before = batch_time_ms(_producer(kind), batches=batches, warmup=warmup)
        step = factor * before
        steps = int(max(40, 800 / step))
        report = ingest.measure_idle(_producer(kind), step_time_ms=step, steps=steps, warmup_steps=20)
        after = batch_time_ms(_producer(kind), batches=batches, warmup=warmup)
        end = Machine.read()
        others = (end.all_cpu_s - start.all_cpu_s) - (end.own_cpu_s - start.own_cpu_s)
        if others > 1.1 * (end.wall_s - start.wall_s):
            crowded.append(round(others / (end.wall_s - start.wall_s), 2))
            continue
        # The producer's speed is timed before and after, and the analytic idle of each
        # bounds the truth: a 10 us sleep is mostly the OS's wake-up (~0.1 ms a batch),
        # which moves by up to 35% within seconds with the other core busy (0.084 then
        # 0.128 ms). Against the mean of the two, 3 of 17 tries were off by 0.06-0.09 on
        # such a machine; against the interval, none of 12 by more than 0.04, while a
        # next() per batch still reads 0.59-0.61 for 0.48-0.51 here (off by 0.09-0.10).
        lo, hi = sorted(max(0.0, 1 - step / produce) for produce in (before, after))
        errors.append(max(0.0, lo - report.idle_fraction, report.idle_fraction - hi))
        if errors[-1] <= 0.05:
            break
    if not errors:
        pytest.skip(f"other processes took more than one of the cores through every try (cores: {crowded})")
    assert min(errors) <= 0.05, (kind, errors, crowded)


def _nominal_ms(kind: str) -> float:
    return {"fast": 0.07}.get(kind) or int(kind[len("sleep_") : -2]) / 1000
