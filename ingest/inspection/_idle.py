"""How long the accelerator waits for input: a meter that consumes a dataset like training.

Simulated device (no accelerator needed): the device runs on a virtual timeline. The
host may run `depth` batches ahead of the device (the batch being computed plus those
queued on the device). The device's step i starts at max(batch i ready, step i-1 done)
and its idle time is the gap. So neither the host's dequeue cost, which an asynchronous
device never sees, nor a device thread's wake-ups are charged as idle.

A `tf.data.Dataset` is consumed inside the graph, as a compiled training step takes its
batches: one host call takes several steps' batches (as Keras' `steps_per_execution`),
each stamped with the time it was ready, in the graph, as it came; the host then lays
those times on the timeline and, before its next call, waits for the device to have room
(`depth` batches). A Python `next()` per batch costs ~0.1-0.5 ms for a batch of 20
tensors: that meter read 32% idle for a producer of 0.064 ms per batch and 0.13 ms steps
(none, analytically); this one reads the producer's own rate down to ~0.02 ms a batch.
Other iterables (NumPy batches, generators) are taken with `next()`.

Definitions follow the TensorFlow Profiler's input-pipeline analysis: input-bound % =
total wait / total step time (wait + compute) over the steady-state steps; >= 20% is
highly input-bound, >= 5% moderately, else not.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from ingest import _optional

__all__ = ["IdleReport", "batch_time_ms", "measure_idle", "measure_train_step", "classify"]

HIGHLY, MODERATELY = 0.20, 0.05


def classify(idle_fraction: float) -> str:
    if idle_fraction >= HIGHLY:
        return "highly input-bound"
    if idle_fraction >= MODERATELY:
        return "moderately input-bound"
    return "not input-bound"


@dataclasses.dataclass(frozen=True)
class IdleReport:
    """Per-step waits and compute times (seconds); steady state excludes warm-up steps."""

    waits: tuple
    computes: tuple
    warmup_steps: int
    examples: int
    wall_seconds: float

    @property
    def steady_waits(self) -> np.ndarray:
        return np.asarray(self.waits[self.warmup_steps :])

    @property
    def steady_computes(self) -> np.ndarray:
        return np.asarray(self.computes[self.warmup_steps :])

    @property
    def steps(self) -> int:
        return len(self.waits) - self.warmup_steps

    @property
    def total_wait(self) -> float:
        return float(self.steady_waits.sum())

    @property
    def total_step_time(self) -> float:
        return float(self.steady_waits.sum() + self.steady_computes.sum())

    @property
    def idle_fraction(self) -> float:
        total = self.total_step_time
        return self.total_wait / total if total > 0 else 0.0

    @property
    def warmup_wait(self) -> float:
        return float(np.sum(self.waits[: self.warmup_steps]))

    @property
    def classification(self) -> str:
        return classify(self.idle_fraction)

    @property
    def step_time_ms(self) -> float:
        return 1000 * self.total_step_time / max(self.steps, 1)

    @property
    def examples_per_sec(self) -> float:
        return self.examples / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def wait_percentiles_ms(self) -> dict:
        w = self.steady_waits * 1000
        if not len(w):
            return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
        return {
            "p50": float(np.percentile(w, 50)),
            "p90": float(np.percentile(w, 90)),
            "p99": float(np.percentile(w, 99)),
            "max": float(w.max()),
        }

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "idle_fraction": self.idle_fraction,
            "classification": self.classification,
            "step_time_ms": self.step_time_ms,
            "examples_per_sec": self.examples_per_sec,
            "warmup_wait_s": self.warmup_wait,
            **{f"wait_{k}_ms": v for k, v in self.wait_percentiles_ms().items()},
        }


def _batch_size(batch) -> int:
    tf = _optional.tensorflow("ingest.measure_idle")

    first = tf.nest.flatten(batch)[0]
    shape = getattr(first, "shape", ())  # a tf.Tensor or a NumPy array
    rank = shape.rank if isinstance(shape, tf.TensorShape) else len(shape)
    return int(shape[0]) if rank else 1


def measure_idle(
    dataset,
    *,
    step_time_ms: float | Callable[[int], float],
    steps: int | None = None,
    warmup_steps: int = 10,
    depth: int = 2,
    steps_per_call: int | None = None,
) -> IdleReport:
    """Consumes `dataset` as an asynchronous device taking `step_time_ms` per step would.

    `step_time_ms` is a number or a function of the step index (e.g. drawn from a
    distribution). `depth` is how many batches the host may run ahead of the device.
    Stops after `steps` steady-state steps, or when the dataset ends.

    A `tf.data.Dataset` is taken inside the graph, `steps_per_call` batches per host call
    (default: as many as make ~5 ms of steps, at most 256; 1 for steps over 2.5 ms);
    anything else iterable, one `next()` per batch.
    """
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if steps_per_call is not None and (
        isinstance(steps_per_call, bool) or not isinstance(steps_per_call, int) or steps_per_call < 1
    ):
        raise ValueError(f"steps_per_call must be a positive integer or None, got {steps_per_call!r}")
    step_of = step_time_ms if callable(step_time_ms) else (lambda i: float(step_time_ms))
    limit = None if steps is None else steps + warmup_steps
    timeline = _Timeline(step_of, depth)
    tf = _optional.tensorflow("ingest.measure_idle")
    if isinstance(dataset, tf.data.Dataset):
        _in_graph(dataset, timeline, limit, steps_per_call or _steps_per_call(step_of(0)))
    else:
        _by_next(iter(dataset), timeline, limit)
    return timeline.report(warmup_steps)


_CALL_SECONDS = 0.005  # steps taken per host call: ~5 ms of them (a call costs ~0.3-0.6 ms here)
_MAX_STEPS_PER_CALL = 256


def _steps_per_call(step_ms: float) -> int:
    return max(1, min(_MAX_STEPS_PER_CALL, int(_CALL_SECONDS * 1000 / max(step_ms, 1e-3))))


class _Timeline:
    """The virtual device: batch i's step starts when it is ready and step i-1 is done."""

    def __init__(self, step_of, depth: int):
        self.step_of, self.depth = step_of, depth
        self.done: list = []  # time each device step finishes (time.time's clock)
        self.waits: list = []
        self.computes: list = []
        self.sizes: list = []
        self.start = self.prev_done = time.time()

    def room_at(self, i: int) -> float:
        """When the host may take batch i: the device holds at most `depth` batches."""
        return self.done[i - self.depth] if i >= self.depth else 0.0

    def wait_for_room(self, i: int) -> None:
        delay = self.room_at(i) - time.time()
        if delay > 0:
            time.sleep(delay)

    def add(self, ready: float, size: int) -> None:
        i = len(self.waits)
        compute = self.step_of(i) / 1000.0
        if compute < 0:
            raise ValueError(f"step_time_ms must be >= 0, got {compute * 1000} at step {i}")
        begin = max(ready, self.prev_done)
        self.waits.append(begin - self.prev_done)
        self.computes.append(compute)
        self.sizes.append(size)
        self.prev_done = begin + compute
        self.done.append(self.prev_done)

    def report(self, warmup_steps: int) -> IdleReport:
        if len(self.waits) <= warmup_steps:
            raise ValueError(
                f"the dataset ended after {len(self.waits)} steps, within the {warmup_steps} warm-up steps; "
                "give a longer dataset or fewer warmup_steps"
            )
        # Wall time of the steady state on the device's timeline.
        steady_start = self.done[warmup_steps - 1] if warmup_steps else self.start
        return IdleReport(
            tuple(self.waits),
            tuple(self.computes),
            warmup_steps,
            int(sum(self.sizes[warmup_steps:])),
            self.prev_done - steady_start,
        )


def _by_next(it, timeline: _Timeline, limit) -> None:
    i = 0
    while limit is None or i < limit:
        timeline.wait_for_room(i)
        try:
            batch = next(it)
        except StopIteration:
            break
        timeline.add(time.time(), _batch_size(batch))
        i += 1


def _in_graph(dataset, timeline: _Timeline, limit, per_call: int) -> None:
    tf = _optional.tensorflow("ingest.measure_idle")
    take = _taker(tf, dataset.element_spec)
    it = iter(dataset)
    i = 0
    while limit is None or i < limit:
        k = per_call if limit is None else min(per_call, limit - i)
        # A call's steps are queued together (Keras' steps_per_execution): it may start
        # while the device holds `depth` batches beyond them, so that the call's own cost
        # on the host (~0.5 ms here) is not charged to the pipeline as idle.
        timeline.wait_for_room(i - k + 1)
        stamps, sizes, n = take(it, tf.constant(k, tf.int32))
        stamps, sizes, n = stamps.numpy(), sizes.numpy(), int(n)
        for j in range(n):
            timeline.add(float(stamps[j]), int(sizes[j]))
        i += n
        if n < k:
            break


def batch_time_ms(dataset, *, batches: int, warmup: int = 256) -> float:
    """The dataset's mean time per batch, taken in the graph as fast as it gives them
    (the same compiled step as `measure_idle`'s): the producer's own speed."""
    tf = _optional.tensorflow("ingest.measure_idle")
    take, it = _taker(tf, dataset.element_spec), iter(dataset)
    take(it, tf.constant(warmup, tf.int32))
    start, got = time.perf_counter(), 0
    while got < batches:
        n = int(take(it, tf.constant(min(_MAX_STEPS_PER_CALL, batches - got), tf.int32))[2])
        if n == 0:
            raise ValueError(f"the dataset ended after {got} of the {batches} batches to time")
        got += n
    return (time.perf_counter() - start) * 1000 / got


def _taker(tf, spec):
    """A compiled step that takes up to k batches, each stamped (tf.timestamp) as it arrives."""

    def rows(batch) -> tf.Tensor:
        first = tf.nest.flatten(batch)[0]
        if isinstance(first, tf.RaggedTensor):
            return tf.cast(first.nrows(), tf.int32)
        return tf.shape(first, out_type=tf.int32)[0] if first.shape.rank else tf.constant(1, tf.int32)

    @tf.function
    def take(iterator, k):
        stamps = tf.TensorArray(tf.float64, size=k)
        sizes = tf.TensorArray(tf.int32, size=k)

        def body(j, going, stamps, sizes):
            got = iterator.get_next_as_optional()
            has = got.has_value()

            def stamp():
                batch = got.get_value()
                # The time is taken once the batch's tensors exist: as a compiled step sees it.
                with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                    return tf.timestamp(), rows(batch)

            t, n = tf.cond(has, stamp, lambda: (tf.constant(0.0, tf.float64), tf.constant(0, tf.int32)))
            return j + tf.cast(has, tf.int32), has, stamps.write(j, t), sizes.write(j, n)

        j, _, stamps, sizes = tf.while_loop(
            lambda j, going, *_: tf.logical_and(going, j < k),
            body,
            (tf.constant(0, tf.int32), tf.constant(True), stamps, sizes),
        )
        return stamps.stack(), sizes.stack(), j

    return take


def measure_train_step(
    model, dataset, *, steps: int | None = None, warmup_steps: int = 5, timed_steps: int = 50
) -> IdleReport:
    """A Keras model's own step time, then the idle it would see on `dataset`.

    The step is timed by `model.fit` on one batch of `dataset` repeated from memory (free
    input), with the model as compiled (its `steps_per_execution` included), over
    `timed_steps` steps after a warm-up fit; weights and optimizer state are put back
    after. `dataset` is then consumed by `measure_idle` on the same virtual timeline, its
    device taking that step time: what an accelerator running this step would wait. (On
    this CPU the step and the pipeline share the cores; on a GPU or TPU they do not.)
    """
    tf = _optional.tensorflow("ingest.measure_train_step")
    batch = next(iter(dataset))
    cached = tf.data.Dataset.from_tensors(batch).repeat()
    saved = [v.numpy() for v in model.weights], [v.numpy() for v in model.optimizer.variables]
    try:
        model.fit(cached, steps_per_epoch=max(2, warmup_steps), epochs=1, verbose=0, shuffle=False)  # compiles the step
        start = time.perf_counter()
        model.fit(cached, steps_per_epoch=timed_steps, epochs=1, verbose=0, shuffle=False)
        step_ms = (time.perf_counter() - start) * 1000 / timed_steps
    finally:
        for v, value in zip(model.weights, saved[0]):
            v.assign(value)
        for v, value in zip(model.optimizer.variables, saved[1]):
            v.assign(value)
    return measure_idle(dataset, step_time_ms=step_ms, steps=steps, warmup_steps=warmup_steps)
