"""What opening a dataset costs: bytes read and requests made to build `make_dataset`.

The seekable block order needs every block's byte offset. A dataset converted with block
indexes (docs/block_format.md) is opened by reading one small index per shard; one
converted before them ("before": the same shards, the indexes taken out of the
metadata) by scanning every shard's TFRecord frame headers, which reads the shards.

One dataset of many small blocks (>= 100k by default: `--block_rows` rows of three
columns each) is converted once, locally, and copied to a GCS emulator on loopback
(`tests/gcs.py`: the test dependencies gcp-storage-emulator and cryptography; run from
the repository). Each open runs in a fresh process, as a trainer's does (offsets are
cached per process), and only builds the dataset (no batch is read):

- local: the process's own read counters (/proc/self/io: `rchar`, bytes through read
  calls, page cache included, and `syscr`, the calls) around `make_dataset`, after a
  warm-up build on a tiny dataset has loaded what a first build loads;
- gs://: every response the emulator sends while the process lives (requests, and body
  bytes: downloads and JSON alike), TensorFlow's GCS client at its defaults.

Rows for one input pipeline and for pipeline 0 of `--pipelines` (`input_context`). It
counts bytes and requests, not time.

    python -m benchmarks.open_cost [--blocks 100000] [--block_rows 4] [--shards 16] [--pipelines 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks import _measure

_BUCKET = "bench"


def _table(rows: int):
    import numpy as np
    import pyarrow as pa

    # Three columns, one a short text: blocks of a few rows stay small, as the ones a
    # large dataset of narrow rows with a small --block_rows would have.
    words = np.array([f"{i:04d}-{i * 7919 % 10007:05d}-seattle-weather" for i in range(1000)], object)
    return pa.table(
        {"id": np.arange(rows), "x": np.arange(rows, dtype=np.float32) / 8, "word": words[np.arange(rows) % 1000]}
    )


def _convert(table, out: str, *args) -> None:
    import pyarrow.parquet as pq

    from beam_jobs import convert

    source = out + ".parquet"
    pq.write_table(table, source)
    with contextlib.redirect_stdout(io.StringIO()):  # its summary table: the benchmark prints its own
        convert.run(["--source", "parquet", "--input", source, "--output", out, *map(str, args)])
    os.remove(source)


def _without_indexes(path: str, to: str) -> None:
    """A copy of the dataset as a conversion before block indexes wrote it."""
    shutil.copytree(path, to)
    meta_path = os.path.join(to, "dataset_info.json")
    meta = json.load(open(meta_path))
    for split in meta["splits"]:
        for shard in split["shards"]:
            os.remove(os.path.join(to, shard.pop("index")))
    with open(meta_path, "w") as f:
        json.dump(meta, f)


def _emulator(workdir: str):
    try:
        from tests.gcs import GcsEmulator
    except ImportError as e:
        raise SystemExit(
            f"the gs:// rows need the GCS emulator of the tests ({e}): run from the repository root, with "
            '`pip install -e ".[test]"`'
        ) from e
    return GcsEmulator(workdir)


def _upload(emulator, local: str, prefix: str) -> None:
    bucket = emulator.client().bucket(_BUCKET)
    for name in sorted(os.listdir(local)):
        bucket.blob(f"{prefix}/{name}").upload_from_filename(os.path.join(local, name))


def _open_in_a_child(spec: dict, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.open_cost", "--child", json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _io() -> dict:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def _child(spec: dict) -> None:
    import tensorflow as tf

    import ingest

    ingest.make_dataset(spec["warm"], batch_size=256)
    ctx = tf.distribute.InputContext(num_input_pipelines=spec["pipelines"], input_pipeline_id=0)
    before = _io()
    ingest.make_dataset(spec["path"], batch_size=256, input_context=ctx)
    after = _io()
    print(json.dumps({"bytes": after["rchar"] - before["rchar"], "requests": after["syscr"] - before["syscr"]}))


def measure(blocks: int, block_rows: int, shards: int, pipelines: int, workdir: str) -> tuple:
    """The dataset's size and the table's rows: each open's bytes and requests."""
    import ingest

    after, before, warm = (os.path.join(workdir, name) for name in ("after", "before", "warm"))
    _convert(_table(blocks * block_rows), after, "--num_shards", shards, "--block_rows", block_rows)
    _without_indexes(after, before)
    _convert(_table(100), warm, "--block_rows", block_rows)
    split = ingest.load_info(after).split("train")
    dataset = {"bytes": split.bytes, "blocks": sum(s.blocks for s in split.shards), "shards": len(split.shards)}
    emulator = _emulator(workdir)
    try:
        emulator.client().create_bucket(_BUCKET)
        for name in ("before", "after"):
            _upload(emulator, os.path.join(workdir, name), name)
        rows = []
        for storage in ("local", "gs://"):
            for count in (1, pipelines):
                for name in ("before", "after"):
                    path = os.path.join(workdir, name) if storage == "local" else f"gs://{_BUCKET}/{name}"
                    spec = {"path": path, "warm": warm, "pipelines": count}
                    with emulator.recording() as served:
                        cost = _open_in_a_child(spec, emulator.env())
                    if storage == "gs://":  # counted at the server, not in the process
                        cost = {"bytes": sum(r.bytes for r in served), "requests": len(served)}
                    rows.append(
                        {
                            "storage": storage,
                            "pipeline": "1 of 1" if count == 1 else f"0 of {count}",
                            "offsets from": "scan (before)" if name == "before" else "index (after)",
                            "bytes read": f"{cost['bytes']:,}",
                            "requests": cost["requests"],
                            "% of dataset": f"{100 * cost['bytes'] / dataset['bytes']:.2f}",
                        }
                    )
    finally:
        emulator.stop()
    return dataset, rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=100_000, help="blocks in the dataset (about)")
    p.add_argument("--block_rows", type=int, default=4)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--pipelines", type=int, default=4, help="input pipelines of the input_context rows")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(json.loads(args.child))
        return
    workdir = tempfile.mkdtemp(prefix="open-cost-")
    try:
        dataset, rows = measure(args.blocks, args.block_rows, args.shards, args.pipelines, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"dataset: {dataset['bytes']:,} bytes, {dataset['blocks']:,} blocks of {args.block_rows} rows "
        f"({dataset['bytes'] / dataset['blocks']:.0f} bytes each), {dataset['shards']} shards"
    )
    print("local: bytes through read calls and the calls (/proc/self/io); gs://: responses of the emulator")
    print(_measure.table(rows, ["storage", "pipeline", "offsets from", "bytes read", "requests", "% of dataset"]))


if __name__ == "__main__":
    main()
