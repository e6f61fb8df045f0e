"""Steady-state rates on a GPU host's cores (#37, #40): run there by `../shared/device`'s kit.

A long-lived iterator, batches drained in-graph (`next` in a `tf.function` loop), each
variant warmed up, then timed in rounds round robin; medians. Copy this file into
`.dev/kit/` before the kit's calls, and run it under `taskset` per core count:

    probe.py tab DATASET...   make_dataset at batch 4096: the defaults, parse windows at once,
                              and each window's blocks read by its parse call
    probe.py img DATASET...   images/s at 224x224 training crops, batch 256

It imports only TensorFlow and ingest (the GPU machine has no benchmarks package).
"""

import json
import os
import statistics
import sys
import time

import tensorflow as tf

import ingest


def rows_of(b):
    x = b[0] if isinstance(b, tuple) else b
    x = next(iter(x.values())) if isinstance(x, dict) else x
    return tf.shape(x, out_type=tf.int64)[0]


@tf.function
def drain(it, k):
    n = tf.constant(0, tf.int64)
    for _ in tf.range(k):
        n += rows_of(next(it))
    return n


def rate(it, k: int) -> float:
    start = time.perf_counter()
    n = int(drain(it, tf.constant(k)))
    return n / (time.perf_counter() - start)


def measure(makers: dict, k: int, rounds: int = 3) -> dict:
    iterators = {}
    for name, make in makers.items():
        iterators[name] = iter(make())
        rate(iterators[name], max(min(k, 20), k // 4))  # fills the pipeline
    rates = {name: [] for name in iterators}
    for _ in range(rounds):
        for name, it in iterators.items():
            rates[name].append(rate(it, k))
    return {name: round(statistics.median(v)) for name, v in rates.items()}


def tabular(path: str, **options):
    return lambda: ingest.make_dataset(
        path, batch_size=4096, seed=3, num_epochs=None, options=ingest.ReadOptions(**options)
    )


def reading_in_calls(path: str):
    """The defaults with each window's blocks read by its own parse call, not by the one
    read thread (`seekable.READS_IN_WINDOW_CALLS`, read when the dataset is built)."""
    from ingest.blocks import seekable

    def make():
        seekable.READS_IN_WINDOW_CALLS = True
        try:
            return tabular(path)()
        finally:
            seekable.READS_IN_WINDOW_CALLS = False

    return make


def main(mode: str, paths: list, batches: int | None = None) -> None:
    cores = len(os.sched_getaffinity(0))
    if mode == "tab":
        for path in paths:
            variants = {"default": tabular(path), "reads in the window calls": reading_in_calls(path)}
            variants |= {
                f"{n} windows at once": tabular(path, num_parallel_calls=n) for n in (4, 8, 16) if n <= 2 * cores
            }
            out = {"mode": mode, "cores": cores, "dataset": path, "rows_per_s": measure(variants, k=batches or 400)}
            print(json.dumps(out), flush=True)
        return

    def images(path):
        return lambda: ingest.make_dataset(
            path, batch_size=256, image_size=(224, 224), training=True, seed=3, num_epochs=None
        )

    makers = {p: images(p) for p in paths}
    print(json.dumps({"mode": mode, "cores": cores, "images_per_s": measure(makers, k=batches or 40)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
