"""Iterator checkpoints on the blocks layout: size, save and restore time, and the cost of the seekable order.

The 500k-row benchmark corpus as blocks, make_dataset shuffled at batch 256. Compared in
the same process on the same data:
- the seekable order (the default): `tf.train.Checkpoint(iterator=it)` saves a position;
- the streaming order (`ReadOptions(seekable_order=False)`), checkpointed by tf.data:
  plainly (its buffers are saved), and with `symbolic_checkpoint=True`.
Each is checkpointed at several positions; restore time runs from a fresh iterator's
`read` to its first batch. Throughput: both orders drained in-graph, epochs round-robin,
medians after a warm-up, with a fresh iterator per epoch, with 8-epoch iterators, and
with endless iterators timed after their first 200 batches (the steady state of a long
training loop: iterator start-up and the first windows left out).

    python -m benchmarks.checkpoints [--rows 500000] [--epochs 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from benchmarks import _measure, corpus


def _variants() -> dict:
    import ingest

    return {
        "seekable order (default)": ingest.ReadOptions(),
        "streaming, plain tf.data checkpoint": ingest.ReadOptions(seekable_order=False),
        "streaming, symbolic tf.data checkpoint": ingest.ReadOptions(seekable_order=False, symbolic_checkpoint=True),
    }


def _size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f != "checkpoint")


def checkpoint_costs(path: str, positions: list, batch_size: int) -> list:
    import tensorflow as tf

    import ingest

    rows = []
    for name, options in _variants().items():
        for position in positions:
            ds = ingest.make_dataset(path, batch_size=batch_size, num_epochs=None, options=options)
            it = iter(ds)
            for _ in range(position):
                next(it)
            folder = tempfile.mkdtemp(prefix="ckpt-")
            try:
                start = time.perf_counter()
                try:
                    prefix = tf.train.Checkpoint(iterator=it).write(os.path.join(folder, "ckpt"))
                except tf.errors.OpError as e:  # reported, not hidden
                    print(f"{name} at batch {position}: save failed: {e.message.splitlines()[0][-120:]}")
                    rows.append({"pipeline": name, "batch": position, "error": e.message.splitlines()[0][-120:]})
                    continue
                save = time.perf_counter() - start
                size = _size(folder)
                fresh = iter(ingest.make_dataset(path, batch_size=batch_size, num_epochs=None, options=options))
                start = time.perf_counter()
                try:
                    tf.train.Checkpoint(iterator=fresh).read(prefix)
                    next(fresh)
                    restore = time.perf_counter() - start
                except tf.errors.OpError as e:  # reported, not hidden
                    restore = float("nan")
                    print(f"{name} at batch {position}: restore failed: {e.message.splitlines()[0][:160]}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            rows.append({"pipeline": name, "batch": position, "bytes": size, "save_s": save, "restore_s": restore})
    return rows


def throughput(path: str, batch_size: int, epochs: int, *, epochs_per_iterator: int | None) -> dict:
    """Median examples/s of both orders, `epochs` rounds of iterators `epochs_per_iterator`
    epochs long; None: endless iterators timed for 3 epochs after a 200-batch warm-up."""
    import ingest

    warmup = 200
    per_epoch = ingest.load_info(path).split("train").records // batch_size

    def maker(seekable: bool):
        options = ingest.ReadOptions(seekable_order=seekable)

        def make():
            ds = ingest.make_dataset(path, batch_size=batch_size, num_epochs=epochs_per_iterator, options=options)
            return ds if epochs_per_iterator else ds.take(warmup + 3 * per_epoch)

        return make

    def drain(ds):
        if epochs_per_iterator:
            return _measure.drain_in_graph(ds)
        return _measure.drain_steady_in_graph(ds, warmup_batches=warmup)

    makers = {"seekable order (default)": maker(True), "streaming order": maker(False)}
    for make in makers.values():
        drain(make())
    rates = {name: [] for name in makers}
    for _ in range(epochs):
        for name, make in makers.items():
            n, s = drain(make())
            rates[name].append(n / s)
    return {name: statistics.median(v) for name, v in rates.items()} | {"runs": rates}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 2 epochs: proves the benchmark runs")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.epochs = 50_000, 2
    path = corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout="blocks")
    per_epoch = args.rows * 9 // 10 // args.batch_size  # the train split holds ~90% of the rows
    positions = sorted({10, per_epoch // 2, per_epoch - 5, per_epoch + per_epoch // 3})
    costs = checkpoint_costs(path, positions, args.batch_size)
    print("| pipeline | at batch | checkpoint KB | save s | restore to first batch s |")
    print("|---|---:|---:|---:|---:|")
    for r in costs:
        if "error" in r:
            print(f"| {r['pipeline']} | {r['batch']} | fails: {r['error']} | | |")
            continue
        print(
            f"| {r['pipeline']} | {r['batch']} | {r['bytes'] / 1024:,.1f} | {r['save_s']:.3f} | {r['restore_s']:.3f} |"
        )
    # A fresh iterator per epoch (what Keras does with a finite dataset) pays the iterator's
    # start-up (graph rewrites, autotune ramp-up) each epoch; a long-lived one (num_epochs=None
    # in a training loop) is the steady state.
    rates = {}
    print()
    print("| order | iterator | examples/s (median) | vs streaming |")
    print("|---|---|---:|---:|")
    iterators = (("one epoch", 1), ("8 epochs", 8), ("endless, after 200 batches (steady state)", None))
    for label, per_iterator in iterators:
        r = throughput(path, args.batch_size, args.epochs, epochs_per_iterator=per_iterator)
        rates[label] = r
        seek, stream = r["seekable order (default)"], r["streaming order"]
        print(f"| streaming | {label} | {stream:,.0f} | 1.00 |")
        print(f"| seekable (default) | {label} | {seek:,.0f} | {seek / stream:.2f} |")
    _measure.write_json(args.out, "checkpoints.json", {"costs": costs, "throughput": rates}, indent=1)


if __name__ == "__main__":
    main()
