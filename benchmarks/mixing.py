"""How well a pipeline mixes rows: two measures that do not depend on speed.

Both read a feature holding each row's index in the source (0 .. rows-1).

- Re-share fraction: of the row pairs that share a batch in epoch 1, the fraction
  that share a batch again in epoch 2. A perfect shuffle scores (batch - 1) / (rows - 1);
  a pipeline that keeps neighbours together (block-mates, a small buffer) scores higher.
- Reach: on a dataset converted with `--no_shuffle`, how far one batch spreads over the
  source order: the median over full batches of (largest index - smallest) / (rows - 1).
  A perfect shuffle reaches ~(batch - 1) / (batch + 1), nearly 1; reading in order,
  (batch - 1) / (rows - 1).

    python -m benchmarks.mixing [--rows 500000] [--batch_size 256]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = ["epoch_batches", "batches_of", "reshare_fraction", "ideal_reshare", "reach", "measure"]


def epoch_batches(ds, key: str, *, rows: int) -> list:
    """One pass over `ds`: the source indices of each batch it delivers, checked complete."""
    batches = [np.asarray(b[key] if isinstance(b, dict) else b[0][key]).ravel() for b in ds]
    if not np.array_equal(np.sort(np.concatenate(batches)), np.arange(rows)):
        raise ValueError(f"one pass does not deliver every source index 0..{rows - 1} exactly once")
    return batches


def batches_of(order, batch_size: int) -> list:
    """A delivery order of source indices cut into consecutive batches of `batch_size`."""
    order = np.asarray(order)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _pairs(counts: np.ndarray) -> int:
    counts = counts.astype(np.int64)
    return int(np.sum(counts * (counts - 1) // 2))


def reshare_fraction(first: list, second: list) -> float:
    """Of the pairs that share a batch in `first`, the fraction that share one in `second`."""
    rows = sum(len(b) for b in first)
    batch_of = np.empty(rows, np.int64)
    for i, b in enumerate(first):
        batch_of[b] = i
    together = _pairs(np.array([len(b) for b in first]))
    again = sum(_pairs(np.bincount(batch_of[b])) for b in second)
    return again / together


def ideal_reshare(rows: int, batch_size: int) -> float:
    return (batch_size - 1) / (rows - 1)


def reach(batches: list, rows: int) -> float:
    """Median over full batches of how far each spreads over the source order, in [0, 1]."""
    size = max(len(b) for b in batches)
    spans = [(int(b.max()) - int(b.min())) / (rows - 1) for b in batches if len(b) == size]
    return float(np.median(spans))


def measure(path: str, *, key: str, batch_size: int, seed: int = 0, **make_dataset_kwargs) -> dict:
    """Re-share fraction (epochs 1 and 2) and reach (epoch 1) of `make_dataset` on `path`.

    The epochs are two passes over one dataset, as Keras' `fit` makes them.
    """
    import ingest

    rows = ingest.load_info(path).split(make_dataset_kwargs.get("split", "train")).records
    ds = ingest.make_dataset(path, batch_size=batch_size, features=[key], label=False, seed=seed, **make_dataset_kwargs)
    first, second = (epoch_batches(ds, key, rows=rows) for _ in range(2))
    return {
        "rows": rows,
        "reshare": reshare_fraction(first, second),
        "ideal_reshare": ideal_reshare(rows, batch_size),
        "reach": reach(first, rows),
    }


def main(argv=None) -> int:
    from benchmarks import _measure, corpus

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default="bench-out/data")
    args = p.parse_args(argv)
    results = []
    for layout in ("rows", "blocks"):
        for shuffled in (True, False):
            path = corpus.ensure_dataset(
                args.workdir, args.rows, args.shards, layout=layout, shuffle=shuffled, indexed=True
            )
            m = measure(path, key=corpus.INDEX, batch_size=args.batch_size)
            results.append(
                {
                    "layout": layout,
                    "converted": "shuffled" if shuffled else "--no_shuffle",
                    **{k: f"{m[k]:.3%}" for k in ("reshare", "ideal_reshare", "reach")},
                }
            )
    print(f"\nMixing at the defaults, {args.rows} rows in {args.shards} shards, batch {args.batch_size}\n")
    print(_measure.table(results, ["layout", "converted", "reshare", "ideal_reshare", "reach"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
