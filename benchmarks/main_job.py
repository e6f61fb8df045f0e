"""The main job on the embedded default: generate a corpus, convert it on Beam's
DirectRunner, feed it to a simulated accelerator, and report how long it sat idle.

    python -m benchmarks.main_job [--rows 200000] [--out out/main]

The corpus is converted in the default blocks layout (columns of 1024 rows per record)
and, for comparison, in the rows layout (one tf.train.Example per row). The simulated
device's step is twice make_dataset's own measured per-batch time on blocks, so a
pipeline that keeps up shows ~0% idle; make_dataset on the row records and the naive
hand-written pipeline run beside it, with the same step.
"""

from __future__ import annotations

import argparse
import os
import shutil

from benchmarks import _measure, _plots, corpus


def _plot(reports: dict, path: str, step_ms: float) -> None:
    plt = _plots.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, report in reports.items():
        waits = [1000 * w for w in report.waits]
        ax.plot(range(len(waits)), waits, label=f"{name}: {100 * report.idle_fraction:.1f}% idle", linewidth=1)
    ax.axvline(reports[next(iter(reports))].warmup_steps, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("training step")
    ax.set_ylabel("accelerator wait before the step (ms)")
    ax.set_yscale("symlog", linthresh=1.0)  # start-up waits are 100x the steady ones
    ax.set_ylim(bottom=0)  # waits are never negative; symlog would show a mirrored axis
    ax.set_title(f"Simulated accelerator, {step_ms:.1f} ms per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="rows in the generated CSV corpus")
    p.add_argument("--out", default="out/main", help="working directory (corpus, dataset, report)")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--steps", type=int, default=300, help="measured steps per pipeline")
    args = p.parse_args(argv)
    _plots.pyplot()  # without matplotlib, stop before the work rather than after it

    dataset, rows_dataset = os.path.join(args.out, "dataset"), os.path.join(args.out, "dataset-rows")
    infos = _convert(args, {"blocks": dataset, "rows": rows_dataset})
    train = infos["blocks"].split("train").records
    per_batch_ms = _per_batch_ms(dataset, args.batch_size, train)
    step_ms = 2 * per_batch_ms
    reports = _idle_reports(dataset, rows_dataset, args, step_ms)
    _report(args, infos, reports, per_batch_ms, step_ms)
    return 0


def _convert(args, outputs: dict) -> dict:
    """The generated CSV corpus (made once) converted anew into each layout: {layout: DatasetInfo}."""
    from beam_jobs import convert  # imported late: --help stays fast

    csv_path = os.path.join(args.out, "corpus", "data.csv")
    if not os.path.exists(csv_path):
        print(f"generating {args.rows} rows into {csv_path}")
        corpus.write_csv(csv_path, args.rows)
    infos = {}
    for layout, path in outputs.items():
        if os.path.exists(path):
            shutil.rmtree(path)
        print(f"converting {csv_path} with Beam's DirectRunner into {path} (--layout {layout})")
        infos[layout] = convert.run(
            ["--source", "csv", "--input", csv_path, "--output", path, "--label", corpus.LABEL,
             "--splits", "train=0.9,eval=0.1", "--num_shards", "8", "--layout", layout]
        )  # fmt: skip
        if infos[layout] is None:
            raise SystemExit("the conversion did not produce a dataset")
    return infos


def _per_batch_ms(dataset: str, batch_size: int, train: int) -> float:
    """make_dataset's own per-batch time, from a full epoch after a warm-up epoch."""
    import ingest

    _measure.drain(ingest.make_dataset(dataset, batch_size=batch_size))
    n, seconds = _measure.drain(ingest.make_dataset(dataset, batch_size=batch_size))
    if n != train:
        raise SystemExit(f"read {n} records but the metadata records {train}")
    return 1000 * seconds / (n / batch_size)


def _idle_reports(dataset: str, rows_dataset: str, args, step_ms: float) -> dict:
    import ingest
    from benchmarks import pipelines

    makers = {
        "make_dataset, blocks": lambda: ingest.make_dataset(dataset, batch_size=args.batch_size, num_epochs=None),
        "make_dataset, rows": lambda: ingest.make_dataset(rows_dataset, batch_size=args.batch_size, num_epochs=None),
        "naive (rows)": lambda: pipelines.naive(rows_dataset, batch_size=args.batch_size).repeat(),
    }
    return {
        name: ingest.measure_idle(make(), step_time_ms=step_ms, steps=args.steps, warmup_steps=20)
        for name, make in makers.items()
    }


def _report(args, infos: dict, reports: dict, per_batch_ms: float, step_ms: float) -> None:
    """The table, the wait timeline (PNG) and report.json."""
    rows = [
        {
            "pipeline": name,
            "idle_%": 100 * r.idle_fraction,
            "verdict": r.classification,
            "examples_per_sec": r.examples_per_sec,
            "wait_p99_ms": r.wait_percentiles_ms()["p99"],
        }
        for name, r in reports.items()
    ]
    plot = os.path.join(args.out, "idle.png")
    _plot(reports, plot, step_ms)
    _measure.write_json(
        args.out,
        "report.json",
        {
            "step_time_ms": step_ms,
            "per_batch_ms": per_batch_ms,
            "pipelines": {k: r.summary() for k, r in reports.items()},
        },
    )
    info = infos["blocks"]
    train = info.split("train").records
    sizes = {layout: i.split("train").bytes / 2**20 for layout, i in infos.items()}
    print(
        f"\n{train} training rows in {len(info.split('train').shards)} shards: {sizes['blocks']:.1f} MB as blocks, "
        f"{sizes['rows']:.1f} MB as rows ({sizes['blocks'] / sizes['rows']:.2f}x). make_dataset delivers a batch "
        f"of {args.batch_size} from blocks every {per_batch_ms:.2f} ms."
    )
    print(f"A simulated accelerator taking {step_ms:.2f} ms per step, {args.steps} steps after warm-up:\n")
    print(_measure.table(rows, ["pipeline", "idle_%", "verdict", "examples_per_sec", "wait_p99_ms"]))
    print(f"\nPer-step wait timeline: {plot}")


if __name__ == "__main__":
    raise SystemExit(main())
