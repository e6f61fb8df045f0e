"""The main job on the embedded default: generate a corpus, convert it on Beam's
DirectRunner, feed it with `ingest.make_dataset`, and report what it measured.

    python -m benchmarks.main_job --rows 200000 --out out/main
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

from benchmarks import corpus


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="rows in the generated CSV corpus")
    p.add_argument("--out", default="out/main", help="working directory (corpus and dataset)")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)

    from beam_jobs import convert  # imported late: argparse --help stays fast
    import ingest

    csv_path = os.path.join(args.out, "corpus", "data.csv")
    dataset = os.path.join(args.out, "dataset")
    if not os.path.exists(csv_path):
        print(f"generating {args.rows} rows into {csv_path}")
        corpus.write_csv(csv_path, args.rows)
    if os.path.exists(dataset):
        shutil.rmtree(dataset)
    print(f"converting with Beam's DirectRunner into {dataset}")
    info = convert.run(["--source", "csv", "--input", csv_path, "--output", dataset, "--label", corpus.LABEL,
                        "--splits", "train=0.9,eval=0.1", "--num_shards", "8"])
    if info is None:
        raise SystemExit("the conversion did not produce a dataset")

    epochs = []
    for epoch in range(args.epochs):
        ds = ingest.make_dataset(dataset, batch_size=args.batch_size, seed=epoch)
        start = time.perf_counter()
        n = sum(int(y.shape[0]) for _, y in ds)
        epochs.append(n / (time.perf_counter() - start))
    train = info.split("train").records
    print()
    print("| measure | value |")
    print("|---|---:|")
    print(f"| records read per epoch | {n} of {train} |")
    print(f"| make_dataset examples/s (median of {args.epochs} epochs) | {statistics.median(epochs):,.0f} |")
    print(f"| batch time at batch {args.batch_size} | {1000 * args.batch_size / statistics.median(epochs):.2f} ms |")
    if n != train:
        raise SystemExit(f"read {n} records but the metadata records {train}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
