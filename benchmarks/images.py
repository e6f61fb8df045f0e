"""Image input speed: make_dataset against a naive Pillow loop and hand-written tf.data pipelines.

Same JPEGs, same run, 224x224 training batches (random resized crop + flip):
  naive        Pillow open, convert, resize, numpy batch; one image at a time, one thread
  tf.data      list files -> read, decode_jpeg, crop, resize, flip in a parallel map ->
               batch -> prefetch (the usual hand-written pipeline; same crop distribution)
  tf.data, TFRecords  the same map over the original-size converted TFRecords (parse,
               decode_jpeg, crop, ...): the baseline of the stored-for-training rows
  make_dataset the converted TFRecords; the crop is decoded alone (decode_and_crop_jpeg)
Two corpora: 500x375 (the reference's product photos) and 2048x1536 (camera photos, where
windows of 2x the output decode at half scale inside the IDCT). On 500x375, also the
datasets stored for training (docs/images.md, "Storing for training"):
  make_dataset, raw 256          --max_side 256 --reencode raw: no decode, a slice
  make_dataset, JPEG 256 q90     --max_side 256 --reencode jpeg --quality 90 (recommended)
each with its bytes per image, images/s per busy core and its ratio to the TFRecords
baseline. Also: conversion throughput, and the size change of --max_side 512 --reencode jpeg.

    python -m benchmarks.images [--images 2000] [--runs 5] [--cores 2] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import shutil
import statistics
import sys
import time

import numpy as np

from benchmarks import _measure, corpus

SIZE = (224, 224)
BATCH = 64
# The stored-for-training conversions measured on 500x375, against the TFRecords baseline.
STORED = {
    "raw 256": ("--max_side", "256", "--reencode", "raw"),
    "JPEG 256 q90": ("--max_side", "256", "--reencode", "jpeg", "--quality", "90"),
}


def _label_of(path: str) -> int:
    """The class index of corpus.ensure_images' layout: ROOT/classNN/<file>."""
    return int(os.path.basename(os.path.dirname(path))[len("class") :])


def naive_batches(files, rng):
    from PIL import Image

    batch, labels = [], []
    for path in itertools.cycle(files):
        with Image.open(path) as img:
            arr = np.asarray(img.convert("RGB").resize(SIZE, Image.Resampling.BILINEAR), np.float32) / 255.0
        if rng.random() < 0.5:
            arr = arr[:, ::-1]
        batch.append(arr)
        labels.append(_label_of(path))
        if len(batch) == BATCH:
            yield np.stack(batch), np.asarray(labels)
            batch, labels = [], []


def _augment(image):
    """The hand-written pipelines' random resized crop (the Inception ranges) and flip of a decoded image."""
    import tensorflow as tf

    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image),
        tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.image.resize(tf.slice(image, begin, size), SIZE)
    return tf.image.random_flip_left_right(image) / 255.0


def hand_written(files):
    import tensorflow as tf

    labels = [_label_of(p) for p in files]

    def load(path, label):
        return _augment(tf.io.decode_jpeg(tf.io.read_file(path), channels=3)), label

    ds = tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files)).repeat()
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def hand_written_records(dataset: str):
    """The hand-written pipeline over a converted dataset's TFRecords: what a user writes without make_dataset."""
    import tensorflow as tf

    import ingest

    info = ingest.load_info(dataset)
    shards = [os.path.join(dataset, s.filename) for s in info.split("train").shards]
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def load(serialized):
        parsed = tf.io.parse_single_example(serialized, features)
        return _augment(tf.io.decode_jpeg(parsed["image/encoded"], channels=3)), parsed["image/class/label"]

    compression = "GZIP" if info.compression == "gzip" else ""
    ds = tf.data.Dataset.from_tensor_slices(shards).shuffle(len(shards)).repeat()
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=min(len(shards), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    ds = ds.shuffle(256)
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def steady_rate(batches, *, warmup: int, measured: int) -> tuple:
    """(images/s, CPU cores busy) over `measured` batches after `warmup` batches of one iterator.

    Steady state, as a training loop sees it: a fresh tf.data iterator spends its first
    second or two ramping up (autotune, thread pools), which would dominate short epochs.
    """
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    start, cpu = time.perf_counter(), time.process_time()
    n = sum(int(next(it)[1].shape[0]) for _ in range(measured))
    wall = time.perf_counter() - start
    return n / wall, (time.process_time() - cpu) / wall


def convert_images(root, out, *extra) -> tuple:
    """(metadata, seconds) of converting the image tree `root` into `out` (replaced)."""
    from beam_jobs import convert

    if os.path.exists(out):
        shutil.rmtree(out)
    start = time.perf_counter()
    info = convert.run(["--source", "images", "--input", root, "--output", out, *extra])
    return info, time.perf_counter() - start


def pin_cores(cores: int | None) -> str:
    """Restricts this process to its first `cores` CPUs (before TensorFlow sizes its thread pools); says which."""
    if cores is None:
        return f"all {os.cpu_count()} cores"
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= cores <= len(allowed):
        raise SystemExit(f"--cores must be 1..{len(allowed)} (the CPUs this process may use), got {cores}")
    os.sched_setaffinity(0, allowed[:cores])
    return f"{cores} cores (CPUs {allowed[:cores]})"


def bytes_per_image(info) -> float:
    """Stored bytes per image of a converted dataset, all splits."""
    return sum(s.bytes for s in info.splits) / max(1, sum(s.records for s in info.splits))


def _converted(corpora, args) -> tuple:
    """({corpus: dataset}, {corpus: info}, {corpus: images/s}) of the originals kept, converted up to 3 times."""
    datasets, infos, conversions = {}, {}, {}
    for name, src in corpora.items():
        datasets[name] = os.path.join(args.workdir, f"images-ds-{os.path.basename(src)}")
        rates = []
        for _ in range(min(args.runs, 3)):
            infos[name], seconds = convert_images(src, datasets[name])
            rates.append(infos[name].source["rows"] / seconds)
        conversions[name] = statistics.median(rates)
    return datasets, infos, conversions


def _stored(root, workdir) -> dict:
    """The corpus at `root` stored for training: {name: (dataset, info, images/s converted)}."""
    stored = {}
    for name, flags in STORED.items():
        out = os.path.join(workdir, f"images-ds-{os.path.basename(root)}-{name.replace(' ', '-')}")
        info, seconds = convert_images(root, out, *flags)
        stored[name] = (out, info, info.source["rows"] / seconds)
    return stored


def _resized(corpora, files, workdir) -> list:
    """Size change and speed of --max_side 512 --reencode jpeg --quality 90 on each corpus."""
    sized = []
    for name, src in corpora.items():
        in_mb = sum(os.path.getsize(f) for f in files[name]) / 2**20
        flags = ("--max_side", "512", "--reencode", "jpeg", "--quality", "90")
        info, seconds = convert_images(src, os.path.join(workdir, "images-resized"), *flags)
        out_mb = sum(s.bytes for s in info.splits) / 2**20
        sized.append(
            {
                "corpus": name,
                "images": info.source["rows"],
                "input_mb": in_mb,
                "output_mb": out_mb,
                "size_ratio": out_mb / in_mb,
                "images_per_sec": info.source["rows"] / seconds,
            }
        )
    return sized


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batches", type=int, default=60, help="batches timed per run, after the warm-up")
    p.add_argument("--warmup_batches", type=int, default=15)
    p.add_argument("--large_images", type=int, default=300, help="2048x1536 JPEGs (phone-camera size)")
    p.add_argument("--cores", type=int, default=None, help="run on this many CPUs (BENCHMARKS.md: 2); default all")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="300 images, 1 run")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.runs, args.large_images, args.batches, args.warmup_batches = 300, 1, 20, 10, 3
    return args


def main(argv=None) -> int:
    args = _args(argv)
    cores = pin_cores(args.cores)
    import ingest

    root = corpus.ensure_images(args.workdir, args.images)
    large = corpus.ensure_images(args.workdir, args.large_images, height=1536, width=2048)
    corpora = {"500x375": root, "2048x1536": large}
    files = {k: sorted(glob.glob(os.path.join(v, "*", "*.jpg"))) for k, v in corpora.items()}
    datasets, infos, conversions = _converted(corpora, args)
    stored = _stored(root, args.workdir)

    rows = []
    for name in corpora:
        # Large images decode ~15x slower: time fewer batches of them.
        scale = 1 if name == "500x375" else 5
        measured = _input_rates(
            _competitors(ingest, files[name], datasets[name], stored if name == "500x375" else {}),
            args,
            warmup=max(1, args.warmup_batches // scale),
            batches=max(2, args.batches // scale),
        )
        per_image = {"make_dataset": bytes_per_image(infos[name]), "tf.data, TFRecords": bytes_per_image(infos[name])}
        per_image["naive (Pillow loop)"] = per_image["hand-written tf.data"] = statistics.mean(
            os.path.getsize(f) for f in files[name]
        )
        per_image.update({f"make_dataset, {k}": bytes_per_image(info) for k, (_, info, _) in stored.items()})
        rows.extend({"corpus": name, **r, "bytes_per_image": per_image[r["pipeline"]]} for r in measured)

    sized = _resized(corpora, files, args.workdir)
    stored_rows = [
        {
            "conversion": " ".join(STORED[name]),
            "bytes_per_image": bytes_per_image(info),
            "vs_original": bytes_per_image(info) / bytes_per_image(infos["500x375"]),
            "images_per_sec": rate,
        }
        for name, (_, info, rate) in stored.items()
    ]

    print(
        f"\nImage input: JPEGs q90, {SIZE[0]}x{SIZE[1]} training batches of {BATCH} (random resized crop + flip); "
        f"steady state, median of {args.runs} runs after a warm-up; {cores}\n"
    )
    columns = ["corpus", "pipeline", "images_per_sec", "per_core", "vs_naive", "vs_tf_data", "vs_records"]
    print(_measure.table(rows, columns + ["cores_busy", "bytes_per_image"]))
    print("\nConversion, originals kept (images/s): " + ", ".join(f"{k}: {v:,.0f}" for k, v in conversions.items()))
    print(
        "\nStored for training, 500x375 (bytes per image; the original TFRecords: "
        f"{bytes_per_image(infos['500x375']):,.0f})\n"
    )
    print(_measure.table(stored_rows, ["conversion", "bytes_per_image", "vs_original", "images_per_sec"]))
    print("\nConversion with --max_side 512 --reencode jpeg --quality 90\n")
    print(_measure.table(sized, ["corpus", "images", "input_mb", "output_mb", "size_ratio", "images_per_sec"]))
    _measure.write_json(
        args.out,
        "images.json",
        {
            "cores": cores,
            "input": rows,
            "conversion_images_per_sec": conversions,
            "stored": stored_rows,
            "resized": sized,
        },
    )
    return 0


def _competitors(ingest, files, dataset, stored) -> dict:
    rng = np.random.default_rng(0)

    def ours(path):
        return lambda: ingest.make_dataset(path, batch_size=BATCH, image_size=SIZE, training=True, num_epochs=None)

    competitors = {
        "naive (Pillow loop)": lambda: naive_batches(files, rng),
        "hand-written tf.data": lambda: hand_written(files),
        "tf.data, TFRecords": lambda: hand_written_records(dataset),
        "make_dataset": ours(dataset),
    }
    competitors.update({f"make_dataset, {name}": ours(path) for name, (path, _, _) in stored.items()})
    return competitors


def _input_rates(competitors, args, *, warmup, batches) -> list:
    rates = {name: [] for name in competitors}
    busy = {name: [] for name in competitors}
    for _ in range(args.runs):  # round-robin, so drift hits all alike
        for name, make in competitors.items():
            rate, cores = steady_rate(make(), warmup=warmup, measured=batches)
            rates[name].append(rate)
            busy[name].append(cores)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return [
        {
            "pipeline": name,
            "images_per_sec": rate,
            # Per busy core: what each costs in CPU, not only what it delivers on these cores.
            "per_core": rate / max(statistics.median(busy[name]), 1e-9),
            "vs_naive": rate / med["naive (Pillow loop)"],
            "vs_tf_data": rate / med["hand-written tf.data"],
            "vs_records": rate / med["tf.data, TFRecords"],
            "cores_busy": statistics.median(busy[name]),
            "runs": rates[name],
        }
        for name, rate in med.items()
    ]


if __name__ == "__main__":
    sys.exit(main())
