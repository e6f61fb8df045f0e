"""`ingest diagnose`: which stage bounds the input pipeline, and what to do about it.

Measures the capacity (rows/s) of each stage, cumulatively, in-graph so the Python
consumer does not cap it: read (shards -> records; on the blocks layout, blocks counted
as the rows they hold), + parse, + shuffle, + preprocess, and a warm cache; compares
them with the consumer's demand (batch_size / step time). `decide` is a pure function
of those numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time

from ingest import _optional
from ingest.pipeline._system import physical_memory

__all__ = ["Diagnosis", "StageCapacity", "decide", "diagnose"]

# The fixes the reference material recommends for each kind of bound.
ADVICE = {
    "read": (
        "I/O-bound: reading shards is slower than the model consumes. Read more shards in parallel "
        "(ReadOptions(cycle_length=...)), convert into more shards (--num_shards), use larger read "
        "buffers or faster storage, or cache the data (cache='auto' or a local file)."
    ),
    "parse": (
        "CPU-bound in parsing: decoding records is slower than the model consumes. Read only the "
        "features the model uses (features=[...]), cache, or give the input pipeline more CPU cores."
    ),
    "shuffle": (
        "Bound by shuffling: the shuffle buffer (rows layout) or the row permutation (blocks layout) is "
        "slower than the model consumes. Give a smaller ReadOptions(shuffle_buffer=...) or "
        "ReadOptions(block_window=...), or cache='memory' (on blocks: parsed once, shuffled by gathering)."
    ),
    "preprocess": (
        "CPU-bound in preprocessing: the preprocess function is slower than the model consumes. "
        "Simplify it, move deterministic work into the conversion job, or give the input pipeline "
        "more CPU cores."
    ),
    "memory": (
        "Memory-bound: batches in flight do not fit the memory budget. Use smaller batches (or smaller "
        "images), or raise ReadOptions(ram_budget_bytes=...)."
    ),
    None: "Not input-bound: every stage delivers faster than the model consumes.",
}
_HEADROOM = 1.1  # a stage must beat the demand by 10% to count as keeping up


@dataclasses.dataclass(frozen=True)
class StageCapacity:
    stage: str
    records_per_sec: float


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    stages: tuple
    demand_records_per_sec: float
    bottleneck: str | None
    advice: str
    cache_keeps_up: bool | None

    def table(self) -> str:
        lines = ["| stage | rows/s | vs demand |", "|---|---:|---:|"]
        for s in self.stages:
            ratio = s.records_per_sec / self.demand_records_per_sec if self.demand_records_per_sec else float("inf")
            lines.append(f"| {s.stage} | {s.records_per_sec:,.0f} | {ratio:.2f}x |")
        lines.append(f"| demand (model) | {self.demand_records_per_sec:,.0f} | 1.00x |")
        return "\n".join(lines)

    def report(self) -> str:
        verdict = f"Bottleneck: {self.bottleneck}." if self.bottleneck else "No bottleneck."
        extra = ""
        if self.bottleneck in ("read", "parse") and self.cache_keeps_up:
            extra = " A warm cache keeps up here: cache='memory' (or 'auto') removes this bound after the first epoch."
        return f"{self.table()}\n\n{verdict} {self.advice}{extra}"


def decide(
    capacities: dict, demand: float, *, batch_bytes: float = 0.0, memory_budget: float = float("inf")
) -> Diagnosis:
    """Names the first stage (read -> parse -> shuffle -> preprocess) that cannot meet `demand`."""
    if demand <= 0:
        raise ValueError(f"demand must be positive records/s, got {demand}")
    stages = tuple(StageCapacity(k, v) for k, v in capacities.items())
    if batch_bytes > memory_budget:
        bottleneck = "memory"
    else:
        bottleneck = None
        for name in ("read", "parse", "shuffle", "preprocess"):
            if name in capacities and capacities[name] < _HEADROOM * demand:
                bottleneck = name
                break
    cache = capacities.get("warm cache")
    return Diagnosis(
        stages, demand, bottleneck, ADVICE[bottleneck], None if cache is None else cache >= _HEADROOM * demand
    )


def _rate(ds, count_fn, runs: int = 2) -> float:
    """Records per second after the first element, the best of `runs` iterators: a stage's
    capacity, not its start nor a moment when something else took the CPU.

    A new iterator's start (functions instantiated, the first window read) is paid once per
    iterator; on a small split it would be most of a stage's time, and the stage measured
    first would look the slowest. Stages are timed one after the other, so a burst of other
    work during one of them would rank them wrongly: the best of two runs damps it.
    """
    return max(_one_rate(ds, count_fn) for _ in range(runs))


def _one_rate(ds, count_fn) -> float:
    import tensorflow as tf

    def step(state, batch):
        total, first, began = state
        total = count_fn(total, batch)
        starting = tf.equal(began, 0.0)
        # The clock starts when the first element arrives; its records are not counted.
        return total, tf.where(starting, total, first), tf.where(starting, tf.timestamp(), began)

    start = time.perf_counter()
    zero = tf.constant(0, tf.int64)
    total, first, began = (x.numpy() for x in ds.reduce((zero, zero, tf.constant(0.0, tf.float64)), step))
    end = time.time()
    if total > first:
        return float(total - first) / max(end - float(began), 1e-9)
    return float(total) / max(time.perf_counter() - start, 1e-9)  # one element or none: all of it


def diagnose(
    path,
    *,
    step_time_ms: float,
    batch_size: int = 256,
    split: str = "train",
    preprocess=None,
    max_records: int = 200_000,
    options=None,
) -> Diagnosis:
    """Measures each stage of make_dataset on `path` against a model taking `step_time_ms` per batch."""
    tf = _optional.tensorflow("ingest.diagnose")

    from ingest.metadata._info import load_info
    from ingest.pipeline import _dataset
    from ingest.pipeline._options import ReadOptions

    if step_time_ms <= 0:
        raise ValueError(f"step_time_ms must be positive, got {step_time_ms}")
    opts = options or ReadOptions()
    info = load_info(path)
    split_info = info.split(split)
    batches = max(1, min(split_info.records, max_records) // batch_size)

    def records_in_batch(total, batch):
        first = tf.nest.flatten(batch)[0]
        return total + tf.shape(first, out_type=tf.int64)[0]

    common = dict(batch_size=batch_size, split=split, shuffle=False, options=opts)
    # A blocks-layout record holds many rows: the read is counted in rows, at the split's average.
    rows_per_record = split_info.records / max(split_info.tfrecords, 1)
    read = _dataset.read_records(path, split=split, options=opts).take(
        math.ceil(batches * batch_size / rows_per_record)
    )
    # Records batched to about a batch's rows: the read is then timed over as many elements
    # as the stages after it (64 blocks at a time left one element after the first here).
    per_element = max(1, round(batch_size / rows_per_record))
    capacities = {"read": _rate(read.batch(per_element), records_in_batch) * rows_per_record}
    capacities["parse"] = _rate(_dataset.make_dataset(path, **common).take(batches), records_in_batch)
    shuffled = {**common, "shuffle": True}
    capacities["shuffle"] = _rate(_dataset.make_dataset(path, **shuffled).take(batches), records_in_batch)
    if preprocess is not None:
        ds = _dataset.make_dataset(path, preprocess=preprocess, **shuffled).take(batches)
        capacities["preprocess"] = _rate(ds, records_in_batch)
    cached = _dataset.make_dataset(path, cache="memory", **common).take(batches)
    _one_rate(cached, records_in_batch)  # fills the cache
    capacities["warm cache"] = _rate(cached, records_in_batch)

    demand = batch_size * 1000.0 / step_time_ms
    avg_record = split_info.bytes / max(split_info.records, 1)
    in_flight = 16  # batches buffered across prefetch and parallel maps, a generous estimate
    budget = opts.ram_budget_bytes or physical_memory() // 2
    return decide(capacities, demand, batch_bytes=avg_record * batch_size * in_flight, memory_budget=budget)
