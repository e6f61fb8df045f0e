"""Smoothness: the device's idle when its step is only a little slower than the pipeline.

A pipeline whose mean per-batch time P is below the device step still idles the device
if batches come in bursts: a window parsed at once, a shard opened, an epoch begun. Here
the device takes 1.1 P per step (P measured in the graph on the same dataset, just
before, over four epochs after one), and `ingest.measure_idle` reports the steady-state idle and the p99 and longest
waits over several epochs of one long-lived iterator (`num_epochs=None`: epochs follow
each other in the stream, as with Keras' `steps_per_epoch`). The host takes 256 steps a
call, as when P was timed; the idle with the meter's default (~5 ms of steps a call, whose
host cost the 2 cores' CPU-bound pipeline pays) is reported beside. Medians of `--runs`
runs.

    python -m benchmarks.smooth [--rows 500000] [--shards 16] [--batch_sizes 256,4096] [--headroom 1.1]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import _measure, corpus

STEPS_PER_CALL = 256  # batches a host call takes: batch_time_ms's (and the meter's most)


def measure(path: str, *, batch_size: int, headroom: float, epochs: float, rows: int) -> dict:
    import ingest

    ds = ingest.make_dataset(path, batch_size=batch_size, shuffle=True, num_epochs=None)
    per_epoch = -(-rows // batch_size)
    # Over several epochs after one: a short timing starts with windows already parsed
    # ahead (measured: 1.14-1.39 ms a batch of 4096 over one epoch, 1.52-1.54 over five).
    producer_ms = ingest.batch_time_ms(ds, batches=4 * per_epoch, warmup=per_epoch)
    steps = int(epochs * per_epoch)
    step_ms = headroom * producer_ms

    def idle(steps_per_call):
        return ingest.measure_idle(
            ds, step_time_ms=step_ms, steps=steps, warmup_steps=per_epoch // 4, steps_per_call=steps_per_call
        )

    # The host takes batches in calls of STEPS_PER_CALL, as batch_time_ms did when it timed
    # the pipeline: on two cores a host call costs the pipeline CPU, and a call every ~5 ms
    # (the meter's default) would charge it a consumer that the timing did not have.
    report, default_calls = idle(STEPS_PER_CALL), idle(None)
    waits = report.wait_percentiles_ms()
    return {
        "batch_size": batch_size,
        "producer_ms": producer_ms,
        "step_ms": step_ms,
        "steps": report.steps,
        "idle_pct": 100 * report.idle_fraction,
        "wait_p99_ms": waits["p99"],
        "wait_max_ms": waits["max"],
        "idle_pct_5ms_calls": 100 * default_calls.idle_fraction,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_sizes", default="256,4096", help="comma-separated")
    p.add_argument("--headroom", type=float, default=1.1, help="device step / the pipeline's mean batch time")
    p.add_argument("--epochs", type=float, default=4.0, help="epochs of steps measured, after a quarter-epoch warm-up")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 1 run: proves the benchmark runs")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 50_000, 1
    path = corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout="blocks")
    rows = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        runs = [
            measure(path, batch_size=batch_size, headroom=args.headroom, epochs=args.epochs, rows=args.rows)
            for _ in range(args.runs)
        ]
        row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        row["idle_pct_runs"] = " / ".join(f"{r['idle_pct']:.2f}" for r in runs)
        rows.append(row)
    print(
        f"\nDevice idle at a step of {args.headroom}x the pipeline's mean batch time, {args.rows} rows in "
        f"{args.shards} shards (blocks, seekable order, shuffled), one iterator over {args.epochs:g} epochs, "
        f"median of {args.runs} runs\n"
    )
    columns = ["batch_size", "producer_ms", "step_ms", "steps", "idle_pct", "idle_pct_runs", "wait_p99_ms"]
    print(_measure.table(rows, columns + ["wait_max_ms", "idle_pct_5ms_calls"]))
    _measure.write_json(args.out, "smooth.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
