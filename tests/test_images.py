"""Image corpora: conversion of folders and manifests, quarantine, re-encoding, and runtime decode."""

from __future__ import annotations

import errno
import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from PIL import Image

import ingest
from beam_jobs import convert
from beam_jobs.convert import ConversionError
from tests.conftest import quarantine_lines, read_examples, run_convert, write_text

RNG = np.random.default_rng(0)


def _rgb(h=48, w=64):
    return Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _save(img, path, fmt, **kw) -> bytes:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    img.save(path, fmt, **kw)
    return open(path, "rb").read()


def _exif_rotated_jpeg(path):
    """A 40x20 (w x h) JPEG, left half red and right half blue, tagged 'rotate 90 CW' (orientation 6)."""
    arr = np.zeros((20, 40, 3), np.uint8)
    arr[:, :20] = (255, 0, 0)
    arr[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    return _save(Image.fromarray(arr), path, "JPEG", quality=95, exif=exif.tobytes())


def _every_format(root) -> dict:
    """One image of each format and mode under root/<label>/; returns {relative path: bytes}."""
    made = {}

    def add(rel, img, fmt, **kw):
        made[rel] = _save(img, root / rel, fmt, **kw)

    add("a/rgb.jpg", _rgb(), "JPEG", quality=90)
    add("a/gray.jpg", _rgb().convert("L"), "JPEG")
    add("a/cmyk.jpg", _rgb().convert("CMYK"), "JPEG")
    add("b/rgba.png", _rgb().convert("RGBA"), "PNG")
    add("b/palette.png", _rgb().convert("P"), "PNG")
    add("b/deep.png", Image.fromarray(RNG.integers(0, 65536, (30, 20), dtype=np.uint16)), "PNG")
    add("b/anim.gif", _rgb().convert("P"), "GIF", save_all=True, append_images=[_rgb().convert("P")])
    add("c/pic.bmp", _rgb(), "BMP")
    add("c/pic.webp", _rgb(), "WEBP", quality=90)
    add("c/pic.tiff", _rgb(), "TIFF")
    made["c/rotated.jpg"] = _exif_rotated_jpeg(root / "c" / "rotated.jpg")
    return made


def _by_name(dataset):
    return {r["image/filename"][0].decode(): r for r in read_examples(dataset)}


def test_folder_tree_keeps_original_bytes_and_labels(tmp):
    made = _every_format(tmp / "in")
    info = run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds")
    assert info.labels == ("a", "b", "c")
    assert info.label == "image/class/label"
    records = _by_name(tmp / "ds")
    assert set(records) == set(made)
    for rel, data in made.items():
        r = records[rel]
        label = rel.split("/")[0]
        assert r["image/class/text"] == [label.encode()]
        assert r["image/class/label"] == [info.labels.index(label)]
        if rel.endswith(".tiff"):  # TensorFlow cannot decode TIFF: stored as lossless PNG
            assert r["image/format"] == [b"png"]
            decoded = np.asarray(Image.open(io.BytesIO(r["image/encoded"][0])))
            np.testing.assert_array_equal(decoded, np.asarray(Image.open(io.BytesIO(data))))
        else:
            assert r["image/encoded"] == [data], rel
        img = Image.open(io.BytesIO(r["image/encoded"][0]))
        assert (r["image/width"][0], r["image/height"][0]) == img.size
    assert records["a/gray.jpg"]["image/channels"] == [1]
    assert records["b/rgba.png"]["image/channels"] == [4]
    assert records["a/cmyk.jpg"]["image/channels"] == [4]
    assert info.image["formats"] == {"bmp": 1, "gif": 1, "jpeg": 4, "png": 4, "webp": 1}
    assert info.image["actions"] == {"converted_to_png": 1}
    assert info.source["rows"] == len(made)


def test_reencode_jpeg_orients_and_converts_every_mode_to_rgb(tmp):
    made = _every_format(tmp / "in")
    info = run_convert(
        "--source", "images", "--input", tmp / "in", "--output", tmp / "ds", "--reencode", "jpeg", "--quality", "85"
    )
    records = _by_name(tmp / "ds")
    assert set(records) == set(made)
    for rel, r in records.items():
        img = Image.open(io.BytesIO(r["image/encoded"][0]))
        assert img.format == "JPEG" and img.mode == "RGB", rel
        assert r["image/format"] == [b"jpeg"] and r["image/channels"] == [3]
    rotated = np.asarray(Image.open(io.BytesIO(records["c/rotated.jpg"]["image/encoded"][0])))
    # 90 degrees clockwise: 40x20 becomes 20x40, the left (red) half becomes the top half.
    assert rotated.shape == (40, 20, 3)
    assert rotated[5, 10, 0] > 200 and rotated[5, 10, 2] < 60
    assert rotated[35, 10, 2] > 200 and rotated[35, 10, 0] < 60
    assert info.image["actions"]["exif_oriented"] == 1
    assert info.image["actions"]["reencoded"] == len(made)
    assert info.options["image"]["reencode"] == "jpeg" and info.options["image"]["quality"] == 85


def test_16_bit_png_is_scaled_not_clipped_when_reencoded(tmp):
    _save(Image.fromarray(np.full((8, 8), 32896, np.uint16)), tmp / "in" / "x" / "deep.png", "PNG")
    run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds", "--reencode", "png")
    (r,) = read_examples(tmp / "ds")
    pixels = np.asarray(Image.open(io.BytesIO(r["image/encoded"][0])))
    np.testing.assert_array_equal(pixels, np.full((8, 8, 3), 128, np.uint8))


def test_alpha_is_composited_on_white_when_reencoded(tmp):
    _save(Image.new("RGBA", (4, 4), (0, 0, 0, 0)), tmp / "in" / "x" / "clear.png", "PNG")
    run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds", "--reencode", "png")
    (r,) = read_examples(tmp / "ds")
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(r["image/encoded"][0]))), np.full((4, 4, 3), 255))


def test_max_side_downsizes_only_larger_images_keeping_aspect(tmp):
    _save(_rgb(300, 600), tmp / "in" / "x" / "big.jpg", "JPEG")
    small = _save(_rgb(30, 60), tmp / "in" / "x" / "small.png", "PNG")
    info = run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds", "--max_side", "100")
    records = _by_name(tmp / "ds")
    big = Image.open(io.BytesIO(records["x/big.jpg"]["image/encoded"][0]))
    assert big.size == (100, 50) and big.format == "JPEG"
    assert (records["x/big.jpg"]["image/width"], records["x/big.jpg"]["image/height"]) == ([100], [50])
    assert records["x/small.png"]["image/encoded"] == [small]
    assert info.image["actions"] == {"resized": 1}


def test_every_bad_image_goes_to_quarantine_and_good_ones_are_written(tmp):
    good = {f"ok/{i}.jpg": _save(_rgb(), tmp / "in" / "ok" / f"{i}.jpg", "JPEG") for i in range(6)}
    jpeg = good["ok/0.jpg"]
    (tmp / "in" / "bad").mkdir()
    (tmp / "in" / "bad" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (tmp / "in" / "bad" / "text.png").write_bytes(b"just some text, not a picture\n" * 10)
    (tmp / "in" / "bad" / "empty.jpg").write_bytes(b"")
    corrupt = bytearray(_save(_rgb(), tmp / "x.png", "PNG"))
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 64] = b"\x00" * 64  # breaks the zlib stream
    (tmp / "in" / "bad" / "corrupt.png").write_bytes(bytes(corrupt))
    _save(_rgb(100, 100), tmp / "in" / "bad" / "huge.png", "PNG")
    (tmp / "in" / "ok" / "notes.txt").write_text("not listed: no image extension")
    info = run_convert(
        "--source",
        "images",
        "--input",
        tmp / "in",
        "--output",
        tmp / "ds",
        "--max_pixels",
        "9999",
        "--max_bad_fraction",
        "0.5",
    )
    records = _by_name(tmp / "ds")
    assert {k: v["image/encoded"] for k, v in records.items()} == {k: [v] for k, v in good.items()}
    kinds = {os.path.basename(q["source"]): q["kind"] for q in quarantine_lines(tmp / "ds")}
    assert kinds == {
        "truncated.jpg": "corrupt",
        "text.png": "not_image",
        "empty.jpg": "empty",
        "corrupt.png": "corrupt",
        "huge.png": "too_large",
    }
    reasons = {os.path.basename(q["source"]): q["reason"] for q in quarantine_lines(tmp / "ds")}
    assert "truncated" in reasons["truncated.jpg"]
    assert "--max_pixels" in reasons["huge.png"]
    assert info.quarantine["records"] == 5
    assert info.labels == ("bad", "ok")  # the vocabulary comes from the folders, not from what survived


def test_too_many_bad_images_fail_the_job_and_leave_no_dataset(tmp):
    _save(_rgb(), tmp / "in" / "x" / "ok.jpg", "JPEG")
    (tmp / "in" / "x" / "bad.jpg").write_bytes(b"junk")
    with pytest.raises(ConversionError, match=r"1 of 2 rows .* --max_bad_fraction"):
        run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds")
    assert not (tmp / "ds" / "dataset_info.json").exists()


def _manifest_corpus(tmp):
    for i in range(4):
        _save(_rgb(), tmp / "in" / "img" / f"{i}.png", "PNG")
    rows = [
        ("img/0.png", "dog", 0.5),
        ("img/1.png", "cat", 1.5),
        (str(tmp / "in" / "img" / "2.png"), "10", 2.5),
        ("img/3.png", "", 3.5),
        ("img/missing.png", "cat", 4.5),
    ]
    return rows


def test_csv_manifest_with_extras_relative_paths_and_bad_rows(tmp):
    rows = _manifest_corpus(tmp)
    write_text(
        tmp / "in" / "manifest.csv", "path,label,weight\n" + "".join(f"{p},{label},{w}\n" for p, label, w in rows)
    )
    info = run_convert(
        "--source",
        "images",
        "--input",
        tmp / "in" / "manifest.csv",
        "--output",
        tmp / "ds",
        "--max_bad_fraction",
        "0.5",
    )
    assert info.labels == ("10", "cat", "dog")
    assert info.feature("weight").dtype == "float32"
    records = sorted(read_examples(tmp / "ds"), key=lambda r: r["weight"])
    assert [r["image/class/text"][0] for r in records] == [b"dog", b"cat", b"10"]
    assert [r["weight"][0] for r in records] == [0.5, 1.5, 2.5]
    assert [r["image/class/label"][0] for r in records] == [2, 1, 0]
    kinds = sorted((q["raw"], q["kind"]) for q in quarantine_lines(tmp / "ds"))
    assert kinds == [("img/3.png", "missing_label"), ("img/missing.png", "unreadable")]


def test_parquet_manifest_with_named_columns(tmp):
    rows = _manifest_corpus(tmp)[:3]
    pq.write_table(
        pa.table({"file": [p for p, _, _ in rows], "cls": [7, 3, 12], "id": [1, 2, 3]}), tmp / "in" / "m.parquet"
    )
    info = run_convert(
        "--source",
        "images",
        "--input",
        tmp / "in" / "m.parquet",
        "--output",
        tmp / "ds",
        "--path_column",
        "file",
        "--label",
        "cls",
    )
    assert info.labels == ("3", "7", "12")  # numeric class names sort as numbers
    got = sorted((r["id"][0], r["image/class/label"][0]) for r in read_examples(tmp / "ds"))
    assert got == [(1, 1), (2, 0), (3, 2)]


def test_manifest_without_the_label_column_names_the_flag(tmp):
    write_text(tmp / "m.csv", "path,y\na.png,1\n")
    with pytest.raises(ConversionError, match=r"no column 'label' \(--label\).*\['path', 'y'\]"):
        run_convert("--source", "images", "--input", tmp / "m.csv", "--output", tmp / "ds")


def test_empty_folder_says_what_layout_is_expected(tmp):
    (tmp / "in").mkdir()
    with pytest.raises(ConversionError, match=r"<label>/<file>"):
        run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds")


def test_chunks_stay_bounded(tmp):
    from beam_jobs.sources.image_records import ImageEntry, ImageOptions, iter_image_chunks

    for i in range(7):
        _save(_rgb(), tmp / f"{i}.png", "PNG")
    entries = [ImageEntry(str(tmp / f"{i}.png"), f"{i}.png", "x") for i in range(7)]
    chunks = list(iter_image_chunks(entries, ImageOptions(batch_images=3), ("x",), ()))
    assert [c.batch.num_rows for c in chunks] == [3, 3, 1]
    assert np.concatenate([c.rows for c in chunks]).tolist() == list(range(7))


# --- runtime ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    _every_format(root / "in")
    for i in range(10):
        _save(_rgb(120, 160), root / "in" / "a" / f"extra{i}.jpg", "JPEG")
    run_convert("--source", "images", "--input", root / "in", "--output", root / "ds", "--num_shards", "2")
    return str(root / "ds")


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "dtype,normalize,low,high",
    [
        ("uint8", None, 0, 255),
        ("float32", "default", 0.0, 1.0),
        ("bfloat16", "imagenet", -2.2, 2.7),
    ],
)
def test_image_batches_have_the_requested_shape_dtype_and_range(image_dataset, training, dtype, normalize, low, high):
    ds = ingest.make_dataset(
        image_dataset,
        batch_size=8,
        image_size=(24, 40),
        training=training,
        image_dtype=dtype,
        normalize=normalize,
        seed=3,
    )
    total = 0
    for images, labels in ds:
        assert images.shape[1:] == (24, 40, 3) and images.dtype == tf.as_dtype(dtype)
        assert labels.dtype == tf.int64
        values = tf.cast(images, tf.float32).numpy()
        assert low <= values.min() and values.max() <= high
        total += images.shape[0]
    assert total == 21


def test_grayscale_channels(image_dataset):
    # The whole epoch: the corpus holds a CMYK JPEG, which libjpeg cannot decode to grayscale.
    for training in (True, False):
        shapes = [
            images.shape[1:]
            for images, _ in ingest.make_dataset(
                image_dataset, batch_size=4, image_size=(16, 16), channels=1, training=training
            )
        ]
        assert shapes and set(shapes) == {(16, 16, 1)}


def test_augmentation_is_reproducible_with_a_seed_and_varies_without(image_dataset):
    def epoch(seed):
        ds = ingest.make_dataset(image_dataset, batch_size=7, image_size=(32, 32), seed=seed)
        return np.concatenate([x.numpy() for x, _ in ds])

    np.testing.assert_array_equal(epoch(5), epoch(5))
    assert not np.array_equal(epoch(5), epoch(6))


def test_eval_takes_the_central_crop(tmp):
    arr = np.zeros((100, 100, 3), np.uint8)  # a red border 5 pixels wide around a green centre
    arr[:, :] = (255, 0, 0)
    arr[5:95, 5:95] = (0, 255, 0)
    _save(Image.fromarray(arr), tmp / "in" / "x" / "framed.png", "PNG")
    _save(Image.fromarray(arr), tmp / "in" / "x" / "framed.jpg", "JPEG", quality=100, subsampling=0)
    run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds")
    images, _ = next(
        iter(
            ingest.make_dataset(
                tmp / "ds", batch_size=2, image_size=(20, 20), training=False, image_dtype="uint8", shuffle=False
            )
        )
    )
    for image in images.numpy():  # 87.5% of 100 = 87 pixels from 7 in: the border is cut off
        assert image[..., 1].min() > 200 and image[..., 0].max() < 60


def _foreign_image_dataset(tmp, encoded_images):
    """An image dataset written by another tool: valid framing, arbitrary image bytes."""
    os.makedirs(tmp / "ds")
    with tf.io.TFRecordWriter(str(tmp / "ds" / "train-00000-of-00001.tfrecord")) as w:
        for i, data in enumerate(encoded_images):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    }
                )
            )
            w.write(ex.SerializeToString())
    info = ingest.DatasetInfo(
        features=(
            ingest.FeatureSpec("image/encoded", "bytes", role="image"),
            ingest.FeatureSpec("image/class/label", "int64", role="label"),
        ),
        splits=(
            ingest.contract.SplitInfo(
                "train",
                (
                    ingest.contract.ShardInfo(
                        "train-00000-of-00001.tfrecord",
                        len(encoded_images),
                        os.path.getsize(tmp / "ds" / "train-00000-of-00001.tfrecord"),
                    ),
                ),
            ),
        ),
        label="image/class/label",
        image={"feature": "image/encoded"},
    )
    (tmp / "ds" / "dataset_info.json").write_text(info.to_json())
    return tmp / "ds"


def test_undecodable_image_at_read_time_fails_or_is_skipped(tmp):
    good = io.BytesIO()
    _rgb().save(good, "JPEG")
    path = _foreign_image_dataset(tmp, [good.getvalue(), b"\xff\xd8\xff garbage", good.getvalue()])
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in ingest.make_dataset(path, batch_size=1, image_size=(8, 8), shuffle=False):
            pass
    labels = [
        int(y)
        for _, ys in ingest.make_dataset(path, batch_size=1, image_size=(8, 8), shuffle=False, skip_corrupt=True)
        for y in ys
    ]
    assert sorted(labels) == [0, 2]


def test_image_options_are_checked(image_dataset):
    with pytest.raises(ValueError, match="image_size=\\(height, width\\)"):
        ingest.make_dataset(image_dataset, batch_size=2)
    with pytest.raises(ValueError, match="uint8.*normalize=None"):
        ingest.make_dataset(image_dataset, batch_size=2, image_size=(8, 8), image_dtype="uint8", normalize="unit")
    with pytest.raises(ValueError, match="channels must be 1"):
        ingest.make_dataset(image_dataset, batch_size=2, image_size=(8, 8), channels=4)
    raw = next(iter(ingest.make_dataset(image_dataset, batch_size=2, features=["image/filename"], label=False)))
    assert set(raw) == {"image/filename"}


def test_metadata_records_the_vocabulary(image_dataset):
    info = json.load(open(os.path.join(image_dataset, "dataset_info.json")))
    assert info["labels"] == ["a", "b", "c"]
    assert info["image"]["feature"] == "image/encoded"


@pytest.mark.slow
@pytest.mark.parametrize("training", [True, False])
def test_large_jpeg_windows_decoded_at_reduced_scale_match_the_full_decode(tmp, training):
    # A smooth 2-D gradient: a window taken from the wrong place or scale changes the colours.
    yy, xx = np.mgrid[0:1600, 0:1800]
    arr = np.stack([xx * 255 // 1800, yy * 255 // 1600, (xx + yy) * 255 // 3400], -1).astype(np.uint8)
    _save(Image.fromarray(arr), tmp / "jpeg" / "x" / "big.jpg", "JPEG", quality=95)
    _save(Image.fromarray(arr), tmp / "png" / "x" / "big.png", "PNG")
    outputs = []
    for fmt in ("jpeg", "png"):
        run_convert("--source", "images", "--input", tmp / fmt, "--output", tmp / f"ds-{fmt}")
        ds = ingest.make_dataset(
            tmp / f"ds-{fmt}",
            batch_size=1,
            image_size=(64, 64),
            training=training,
            seed=11,
            num_epochs=8,
            image_dtype="uint8",
        )
        outputs.append(np.concatenate([x.numpy() for x, _ in ds]).astype(np.float32))
    jpeg, png = outputs  # same seeds: the same windows; JPEG ones go through DCT scaling, PNG ones do not
    assert jpeg.shape == png.shape == (8, 64, 64, 3)
    assert np.abs(jpeg - png).mean() < 3.0


def test_raw_records_of_an_image_dataset_can_be_read_without_decoding(image_dataset):
    from ingest._dataset import read_records  # the read stage diagnose measures

    assert sum(1 for _ in read_records(image_dataset)) == 21


def test_symlink_loops_and_dangling_links_go_to_quarantine_as_unreadable(tmp):
    good = {f"cat/{i}.jpg": _save(_rgb(), tmp / "in" / "cat" / f"{i}.jpg", "JPEG") for i in range(3)}
    elsewhere = _save(_rgb(), tmp / "elsewhere" / "b.png", "PNG")
    cat = tmp / "in" / "cat"
    os.symlink("self.jpg", cat / "self.jpg")  # a loop of one
    os.symlink("pong.jpg", cat / "ping.jpg")  # a loop of two
    os.symlink("ping.jpg", cat / "pong.jpg")
    os.symlink(tmp / "nowhere.jpg", cat / "dangling.jpg")
    os.symlink(tmp / "no_such_folder", tmp / "in" / "dog")  # a dangling label folder
    os.symlink(tmp / "elsewhere", tmp / "in" / "bird")  # a linked label folder is followed
    os.symlink(cat / "0.jpg", cat / "alias.jpg")  # a good link to a file is read
    os.symlink(tmp / "nowhere.txt", cat / "notes.txt")  # not an image name: skipped as any such file
    info = run_convert("--source", "images", "--input", tmp / "in", "--output", tmp / "ds", "--max_bad_fraction", "0.9")
    records = _by_name(tmp / "ds")
    assert {k: v["image/encoded"] for k, v in records.items()} == {
        **{k: [v] for k, v in good.items()},
        "bird/b.png": [elsewhere],
        "cat/alias.jpg": [good["cat/0.jpg"]],
    }
    bad = {q["raw"]: q for q in quarantine_lines(tmp / "ds")}
    assert set(bad) == {"cat/self.jpg", "cat/ping.jpg", "cat/pong.jpg", "cat/dangling.jpg", "dog"}
    assert {q["kind"] for q in bad.values()} == {"unreadable"}
    assert "loop" in bad["cat/self.jpg"]["reason"] and "loop" in bad["cat/ping.jpg"]["reason"]
    assert "dangling" in bad["cat/dangling.jpg"]["reason"] and "nowhere.jpg" in bad["cat/dangling.jpg"]["reason"]
    assert "dangling" in bad["dog"]["reason"]
    assert info.quarantine["records"] == 5 and info.quarantine["reasons"] == {"unreadable": 5}
    assert info.source["rows"] == 5 + 5 and info.source["files"] == 10
    assert info.labels == ("bird", "cat")


@pytest.mark.parametrize("denied", ["label folder", "image's entry", "image's bytes", "label folder (I/O error)"])
def test_a_folder_or_image_the_job_may_not_read_stops_it_naming_the_path(tmp, monkeypatch, capsys, denied):
    # Quarantining a folder that cannot be listed would count its unknown number of images
    # as one bad row, and a refused image is not damaged. Root reads everything, so the
    # refusal is raised where the OS would raise it.
    for rel in ("cat/0.jpg", "cat/1.jpg", "dog/0.jpg", "dog/1.jpg"):
        _save(_rgb(), tmp / "in" / rel, "JPEG")
    target, module, function = {
        "label folder": (tmp / "in" / "dog", os, "scandir"),
        "image's entry": (tmp / "in" / "dog" / "1.jpg", os, "stat"),
        "image's bytes": (tmp / "in" / "dog" / "1.jpg", io, "open"),  # Beam's local filesystem opens with io.open
        "label folder (I/O error)": (tmp / "in" / "dog", os, "scandir"),
    }[denied]
    real = getattr(module, function)

    def refuse(path=".", *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and os.fspath(path) == str(target):
            if denied.endswith("(I/O error)"):
                raise OSError(errno.EIO, "Input/output error", str(target))
            raise PermissionError(errno.EACCES, "Permission denied", str(target))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, function, refuse)
    code = convert.main(
        ["--source", "images", "--input", str(tmp / "in"), "--output", str(tmp / "ds"), "--max_bad_fraction", "0.5"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1
    assert errors == [
        f"error: cannot list label folder {target}: Input/output error; repair it or move it out of --input"
        if denied.endswith("(I/O error)")
        else f"error: permission denied on --input {target}: [Errno 13] Permission denied: '{target}'; "
        "give the user the job runs as access to it, or choose another path"
    ]
    assert not (tmp / "ds" / "dataset_info.json").exists() and not list((tmp / "ds").rglob("quarantine/*"))


def test_manifest_extra_values_that_do_not_fit_quarantine_their_image(tmp):
    for i in range(3):
        _save(_rgb(), tmp / "in" / f"{i}.png", "PNG")
    manifest = pa.table(
        {
            "path": [f"{i}.png" for i in range(3)],
            "label": ["a", "b", "a"],
            "uid": pa.array([1, 2**64 - 1, 3], pa.uint64()),
        }
    )
    pq.write_table(manifest, tmp / "in" / "m.parquet")
    info = run_convert(
        "--source", "images", "--input", tmp / "in" / "m.parquet", "--output", tmp / "ds", "--max_bad_fraction", "0.5"
    )
    assert sorted(r["uid"][0] for r in read_examples(tmp / "ds")) == [1, 3]
    [bad] = quarantine_lines(tmp / "ds")
    assert bad["kind"] == "type" and bad["raw"] == "1.png" and "18446744073709551615" in bad["reason"]
    assert info.quarantine["records"] == 1
