"""The idle meter against producers of known speed: does it read the analytic idle?

python -m benchmarks.meter [--seconds 1.5]

Each producer yields batches of 22 tensors (256 rows) at its own speed P, measured in the
graph as fast as it gives them (`ingest.batch_time_ms`). A device step of f * P
idles max(0, 1 - f) of the time. The table shows what the in-graph meter
(`ingest.measure_idle` on the dataset) and a Python next() per batch (the same timeline,
the dataset's iterator passed instead) read, for f = 0.5 and 2.
"""

from __future__ import annotations

import argparse

import tensorflow as tf

import ingest
from benchmarks import _measure
from ingest import batch_time_ms

PRODUCERS = ("fast", "sleep_10us", "sleep_1000us", "sleep_25000us")


def producer(kind: str) -> tf.data.Dataset:
    """Batches of 22 tensors of 256 rows: from memory ("fast"), or each after a sleep in a
    tf.data thread (tf.data's testing sleep: C++, ~0.1 ms over, which the timing includes)."""
    from tensorflow.python.data.experimental.ops import testing

    batch = {f"f{i}": tf.zeros([256], tf.float32 if i % 2 else tf.int64) for i in range(22)}
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    if kind != "fast":
        ds = ds.apply(testing.sleep(int(kind[len("sleep_") : -2])))
    return ds.prefetch(8)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=1.5, help="device time per measurement")
    args = p.parse_args(argv)
    rows = []
    for kind in PRODUCERS:
        nominal = {"fast": 0.07, "sleep_10us": 0.12}.get(kind) or int(kind[len("sleep_") : -2]) / 1000
        produce = batch_time_ms(producer(kind), batches=max(40, int(500 / nominal)))
        for factor in (0.5, 2.0):
            step = factor * produce
            steps = int(max(40, 1000 * args.seconds / step))
            row = {"producer": kind, "producer_ms": produce, "step_ms": step, "analytic_idle": max(0.0, 1 - factor)}
            for name, source in (("in_graph", producer(kind)), ("python_next", iter(producer(kind)))):
                report = ingest.measure_idle(source, step_time_ms=step, steps=steps, warmup_steps=20)
                row[f"{name}_idle"] = report.idle_fraction
            rows.append(row)
            print(_measure.table([row], list(row)), flush=True)
    print("\nIdle meter against producers of known speed (22 tensors a batch)\n")
    print(_measure.table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
