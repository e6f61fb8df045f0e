"""How long the accelerator waits for input: a meter that consumes a dataset like training.

Simulated device (no accelerator needed): the device runs on a virtual timeline. The
host may run `depth` batches ahead of the device (the batch being computed plus those
queued on the device); it sleeps until it may, then takes the next batch. The device's
step i starts at max(batch i ready, step i-1 done) and its idle time is the gap. So
neither the host's dequeue cost (~1 ms for a 21-tensor batch), which an asynchronous
device never sees, nor a device thread's GIL wake-ups are charged as idle.

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

__all__ = ["IdleReport", "measure_idle", "measure_train_step", "classify"]

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
) -> IdleReport:
    """Consumes `dataset` as an asynchronous device taking `step_time_ms` per step would.

    `step_time_ms` is a number or a function of the step index (e.g. drawn from a
    distribution). `depth` is how many batches the host may run ahead of the device.
    Stops after `steps` steady-state steps, or when the dataset ends.
    """
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    step_of = step_time_ms if callable(step_time_ms) else (lambda i: float(step_time_ms))
    limit = None if steps is None else steps + warmup_steps
    done: list = []  # virtual time each device step finishes
    waits, computes = [], []
    examples = 0
    it = iter(dataset)
    start = prev_done = time.perf_counter()
    i = 0
    while limit is None or i < limit:
        if i >= depth:
            # The host may not run more than `depth` batches ahead of the device.
            delay = done[i - depth] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        try:
            batch = next(it)
        except StopIteration:
            break
        ready = time.perf_counter()
        begin = max(ready, prev_done)
        compute = step_of(i) / 1000.0
        if compute < 0:
            raise ValueError(f"step_time_ms must be >= 0, got {compute * 1000} at step {i}")
        waits.append(begin - prev_done)
        computes.append(compute)
        prev_done = begin + compute
        done.append(prev_done)
        if i >= warmup_steps:
            examples += _batch_size(batch)
        i += 1
    if len(waits) <= warmup_steps:
        raise ValueError(
            f"the dataset ended after {len(waits)} steps, within the {warmup_steps} warm-up steps; "
            "give a longer dataset or fewer warmup_steps"
        )
    # Wall time of the steady state on the device's timeline.
    steady_start = done[warmup_steps - 1] if warmup_steps else start
    return IdleReport(tuple(waits), tuple(computes), warmup_steps, examples, prev_done - steady_start)


def measure_train_step(model, dataset, *, steps: int | None = None, warmup_steps: int = 5) -> IdleReport:
    """A real Keras training loop: wait is the time in the iterator's next(), compute is
    `train_on_batch` (CPU here; the same code measures a GPU or TPU elsewhere)."""
    waits, computes = [], []
    examples = 0
    it = iter(dataset)
    limit = None if steps is None else steps + warmup_steps
    i = 0
    t_start = None
    while limit is None or i < limit:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if isinstance(batch, tuple):
            model.train_on_batch(*batch)
        else:
            model.train_on_batch(batch)
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        computes.append(t2 - t1)
        if i == warmup_steps:
            t_start = t0
        if i >= warmup_steps:
            examples += _batch_size(batch)
        i += 1
    if len(waits) <= warmup_steps:
        raise ValueError(f"the dataset ended after {len(waits)} steps, within the {warmup_steps} warm-up steps")
    return IdleReport(tuple(waits), tuple(computes), warmup_steps, examples, time.perf_counter() - t_start)
