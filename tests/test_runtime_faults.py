"""make_dataset on damaged datasets: missing or overfull shards, bad metadata, empty splits.

Each test converts a real dataset, damages a copy with plain file operations, and checks
that the runtime stops with an error naming what is wrong, or (skip_corrupt=True) skips
and counts. Damage that used to hang runs under `_finishes`, so that a regression fails
the test instead of hanging the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading

import pytest
import tensorflow as tf

import ingest
from ingest import contract
from tests.conftest import run_convert, write_text

N = 1000
SHARDS = 8


@pytest.fixture(scope="module", params=["rows", "blocks"])
def source(tmp_path_factory, request):
    """N rows with a unique id, in SHARDS shards, in each layout (blocks of 16 rows: ~8 per shard)."""
    root = tmp_path_factory.mktemp("faults")
    src = write_text(root / "in" / "a.csv", "id,x\n" + "".join(f"{i},{i / 4}\n" for i in range(N)))
    run_convert(
        "--source", "csv", "--input", src, "--output", root / "ds", "--num_shards", SHARDS,
        "--layout", request.param, *(["--block_rows", 16] if request.param == "blocks" else []),
    )  # fmt: skip
    return str(root / "ds")


@pytest.fixture
def copy(source, tmp_path):
    dst = str(tmp_path / "ds")
    shutil.copytree(source, dst)
    return dst


def _shard(path, index=2):
    """(file path, rows) of one shard of the train split."""
    shard = ingest.load_info(path).split("train").shards[index]
    return os.path.join(path, shard.filename), shard.records


def _counted(path, index=2) -> str:
    """How the read stage counts a shard while reading: "8 blocks" or "125 records"."""
    info = ingest.load_info(path)
    shard = info.split("train").shards[index]
    return f"{shard.blocks} blocks" if info.layout == "blocks" else f"{shard.records} records"


def _finishes(fn, seconds=120):
    """Runs fn() in a thread; returns its result, re-raises its error, fails if it is still running.

    A guard against hangs, not a speed check: the bound is far above the seconds this takes.
    """
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the test thread)
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: hung"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _ids(ds, seen=None):
    seen = [] if seen is None else seen
    for batch in ds:
        seen.extend(batch["id"].numpy().tolist())
    return seen


# 1. A missing shard file.


def test_missing_shard_is_refused_when_building_naming_the_file(copy):
    victim, records = _shard(copy)
    os.remove(victim)
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(victim)} \({records} records\).*skip_corrupt=True"):
        ingest.make_dataset(copy, batch_size=64)


@pytest.mark.parametrize("symbolic", [False, True])
def test_shard_deleted_after_building_is_an_error_naming_it(copy, symbolic):
    victim, _ = _shard(copy)
    ds = ingest.make_dataset(copy, batch_size=64, options=ingest.ReadOptions(symbolic_checkpoint=symbolic))
    os.remove(victim)
    with pytest.raises(tf.errors.OpError, match=rf"shard {re.escape(victim)} is missing.*{_counted(copy)}"):
        _finishes(lambda: _ids(ds))


@pytest.mark.parametrize("when", ["before building", "after building"])
def test_skip_corrupt_counts_every_record_of_a_missing_shard_and_goes_on(copy, when):
    victim, records = _shard(copy)
    if when == "before building":
        os.remove(victim)
    ds = ingest.make_dataset(copy, batch_size=64, skip_corrupt=True, num_epochs=2)
    if when == "after building":
        os.remove(victim)
    before = ingest.skipped_corrupt_records().get(victim, 0)
    ids = _finishes(lambda: _ids(ds))
    assert len(ids) == 2 * (N - records) and len(set(ids)) == N - records
    assert ingest.skipped_corrupt_records()[victim] - before == 2 * records


def test_missing_shard_on_gcs_is_named_when_building_and_when_reading(source, tmp_path):
    from tests.gcs import GcsEmulator

    os.makedirs(tmp_path / "gcs")
    emulator = GcsEmulator(str(tmp_path / "gcs"))
    try:
        with pytest.MonkeyPatch.context() as patch:
            for k, v in emulator.env().items():
                patch.setenv(k, v)
            # A bucket per layout: TensorFlow's GCS client caches object sizes per path, process-wide.
            name = f"bkt-{ingest.load_info(source).layout}"
            bucket = emulator.client().create_bucket(name)
            for f in os.listdir(source):
                bucket.blob(f"d[1]/{f}").upload_from_filename(os.path.join(source, f))
            path = f"gs://{name}/d[1]"  # glob characters: the in-graph lookup must not treat them as a pattern
            info = ingest.load_info(path)
            first, second = (info.split("train").shards[i] for i in (1, 2))
            ds = ingest.make_dataset(path, batch_size=64)
            bucket.blob(f"d[1]/{first.filename}").delete()
            with pytest.raises(
                FileNotFoundError, match=re.escape(f"{path}/{first.filename} ({first.records} records)")
            ):
                ingest.make_dataset(path, batch_size=64)
            # The streaming order says "is missing"; the seekable one (blocks) gets TensorFlow's 404 naming it.
            with pytest.raises(
                tf.errors.OpError,
                match=rf"shard {re.escape(f'{path}/{first.filename}')} is missing"
                rf"|HTTP response code 404\s+when reading {re.escape(f'{path}/{first.filename}')}",
            ):
                _finishes(lambda: _ids(ds))
            ds = ingest.make_dataset(path, batch_size=64, skip_corrupt=True)
            bucket.blob(f"d[1]/{second.filename}").delete()
            assert len(_finishes(lambda: _ids(ds))) == N - first.records - second.records
    finally:
        emulator.stop()


def test_read_records_refuses_a_missing_shard(copy):
    victim, _ = _shard(copy, 0)
    os.remove(victim)
    with pytest.raises(FileNotFoundError, match=re.escape(victim)):
        _finishes(lambda: ingest.diagnose(copy, step_time_ms=10, batch_size=64))


# 2. A shard holding more records than its metadata says.


@pytest.mark.parametrize("skip_corrupt, symbolic", [(False, False), (True, False), (False, True)])
def test_shard_with_more_records_than_its_metadata_is_an_error_naming_it(copy, skip_corrupt, symbolic):
    victim, _ = _shard(copy)
    count, unit = _counted(copy).split()
    with open(victim, "rb") as f:
        frames = f.read()
    with open(victim, "ab") as f:  # the shard's own records again: valid frames, twice as many
        f.write(frames)
    if ingest.load_info(copy).layout == "blocks" and not skip_corrupt:
        # The seekable block order indexes every shard's blocks first and refuses it there.
        with pytest.raises(ValueError, match=rf"shard {re.escape(victim)} holds more blocks than its metadata says"):
            ingest.make_dataset(copy, batch_size=16, shuffle=False)
    ds = ingest.make_dataset(
        copy,
        batch_size=16,
        skip_corrupt=skip_corrupt,
        shuffle=False,
        options=ingest.ReadOptions(symbolic_checkpoint=symbolic, seekable_order=False),
    )
    seen = []
    with pytest.raises(
        tf.errors.OpError,
        match=rf"shard {re.escape(victim)} holds more {unit} than its "
        rf"metadata says.*{count}.*metadata and the shard disagree",
    ):
        _finishes(lambda: _ids(ds, seen))
    assert len(seen) == len(set(seen))  # none of the extra copies was delivered


def test_skipping_corrupt_records_never_delivers_a_row_more_than_a_shard_lists(copy):
    victim, rows = _shard(copy)
    meta = os.path.join(copy, contract.METADATA_FILENAME)
    info = json.loads(open(meta).read())
    info["splits"][0]["shards"][2]["records"] = rows - 1
    info["splits"][0]["records"] -= 1
    with open(meta, "w") as f:
        f.write(json.dumps(info))
    shard = ingest.load_info(copy).split("train").shards[2]
    ds = ingest.make_dataset(
        copy,
        batch_size=16,
        skip_corrupt=True,
        shuffle=False,
        options=ingest.ReadOptions(seekable_order=False),
    )
    if shard.blocks is not None:  # blocks: the shard's last block holds one row more than listed
        error = rf"shard {re.escape(victim)} block {shard.blocks - 1} holds \d+ rows, but .*lists \d+ \(16 a block"
    else:  # rows: one record more
        error = rf"shard {re.escape(victim)} holds more records than its metadata says"
    seen = []
    with pytest.raises(tf.errors.OpError, match=error + ".*metadata and the shard disagree"):
        _finishes(lambda: _ids(ds, seen))
    assert len(seen) == len(set(seen)) < N


# 3. A malformed dataset_info.json.


def _truncate(text):
    return text[: len(text) // 2]


def _edit(change):
    def apply(text):
        d = json.loads(text)
        change(d)
        return json.dumps(d)

    return apply


MALFORMED = {
    "truncated": (_truncate, r"not valid JSON \(cut short\?\)"),
    "empty": (lambda text: "", r"it is empty"),
    "not an object": (lambda text: "[1, 2]", r"the metadata must be an object, got a list"),
    "no features key": (_edit(lambda d: d.pop("features")), r"metadata has no 'features' key"),
    "features not a list": (
        _edit(lambda d: d.update(features={"id": "int64"})),
        r"metadata.features must be a list, got an object",
    ),
    "feature without dtype": (
        _edit(lambda d: d["features"][0].pop("dtype")),
        r"metadata.features\[0\] \('id'\) has no 'dtype' key",
    ),
    "feature shape of text": (
        _edit(lambda d: d["features"][1].update(shape="3")),
        r"metadata.features\[1\] \('x'\).shape must be a list, got a string",
    ),
    "unknown feature key": (
        _edit(lambda d: d["features"][0].update(dtpye="int64")),
        r"metadata.features\[0\] has unknown key\(s\) \['dtpye'\]",
    ),
    "records as text": (
        _edit(lambda d: d["splits"][0]["shards"][1].update(records="125")),
        r"metadata.splits\[0\] \('train'\).shards\[1\].records must be an integer, got a string '125'",
    ),
    "negative bytes": (
        _edit(lambda d: d["splits"][0]["shards"][0].update(bytes=-1)),
        r"shards\[0\].bytes must be >= 0, got -1",
    ),
    "shard outside the dataset": (
        _edit(lambda d: d["splits"][0]["shards"][0].update(filename="../../etc/passwd")),
        r"shards\[0\].filename must name a file inside the dataset directory",
    ),
    "split without shards key": (
        _edit(lambda d: d["splits"][0].pop("shards")),
        r"metadata.splits\[0\] \('train'\) has no 'shards' key",
    ),
    "split total disagrees": (
        _edit(lambda d: d["splits"][0].update(records=5)),
        r"\('train'\).records is 5 but its shards add up to 1000",
    ),
    "label not a string": (
        _edit(lambda d: d.update(label=3)),
        r"metadata.label must be a string or null, got an integer 3",
    ),
    "bad dtype": (_edit(lambda d: d["features"][0].update(dtype="int32")), r"feature 'id': dtype must be one of"),
    "default of the wrong type": (
        _edit(lambda d: d["features"][0].update(default="zero")),
        r"\('id'\).default 'zero' does not fit dtype 'int64'",
    ),
}


@pytest.mark.parametrize("damage", sorted(MALFORMED))
def test_malformed_metadata_names_the_file_and_what_is_wrong(copy, damage):
    change, what = MALFORMED[damage]
    meta = os.path.join(copy, "dataset_info.json")
    with open(meta, encoding="utf-8") as f:
        text = f.read()
    with open(meta, "w", encoding="utf-8") as f:
        f.write(change(text))
    with pytest.raises(ValueError, match=rf"{re.escape(meta)} is not usable dataset metadata: .*{what}") as err:
        ingest.make_dataset(copy, batch_size=8)
    assert not isinstance(err.value, FileNotFoundError)


def _shard_edit(**fields):
    """An edit of the train split's first shard (its split's totals kept in step), without its block index."""

    def change(d):
        split = d["splits"][0]
        shard = split["shards"][0]
        shard.update(fields)
        shard.pop("index", None)
        split["records"] = sum(s["records"] for s in split["shards"])
        split["bytes"] = sum(s["bytes"] for s in split["shards"])
        d.update(block_rows=fields.pop("block_rows", d["block_rows"]))

    return _edit(change)


# Counts a reader sizes its tables by before reading a shard; 10**12 blocks crashed the
# process (SIGSEGV), 10**12 block_rows ended in a ResourceExhaustedError after ~90 s.
CRAFTED_COUNTS = {
    "more blocks than records": (
        _shard_edit(blocks=10**12),
        r"shards\[0\].blocks is 1000000000000, more than its \d+ records",
    ),
    "blocks disagree with rows": (
        _shard_edit(blocks=3),
        r"split 'train', shard '\S+': blocks is 3, but its \d+ records in blocks of block_rows=16 make [78]",
    ),
    "block_rows out of range": (_shard_edit(block_rows=10**12), r"block_rows must be in \[1, 65536\].*got 10{12}"),
    "bytes below the frames": (
        _shard_edit(records=16 * 10**12, blocks=10**12),
        r"shard '\S+': bytes is \d+, less than the 16000000000000 its 1000000000000 TFRecords take",
    ),
}


@pytest.mark.parametrize("source", ["blocks"], indirect=True)
@pytest.mark.parametrize("damage", sorted(CRAFTED_COUNTS))
def test_crafted_block_counts_are_refused_naming_the_file_and_field(copy, damage):
    change, what = CRAFTED_COUNTS[damage]
    meta = os.path.join(copy, contract.METADATA_FILENAME)
    with open(meta) as f:
        text = f.read()
    with open(meta, "w") as f:
        f.write(change(text))
    with pytest.raises(ValueError, match=rf"{re.escape(meta)} is not usable dataset metadata: .*{what}"):
        _finishes(lambda: ingest.make_dataset(copy, batch_size=8), seconds=60)


@pytest.mark.parametrize("source", ["blocks"], indirect=True)
def test_block_counts_the_shard_file_cannot_hold_are_refused_before_reading(copy):
    victim, _ = _shard(copy, 0)
    meta = os.path.join(copy, contract.METADATA_FILENAME)
    with open(meta) as f:
        text = f.read()
    # Counts that agree with each other, not with the file: only its size tells.
    with open(meta, "w") as f:
        f.write(_shard_edit(records=16 * 10**12, blocks=10**12, bytes=16 * 10**12)(text))
    with pytest.raises(ValueError, match=rf"shard {re.escape(victim)} has \d+ bytes, fewer than the 16000000000000"):
        _finishes(lambda: ingest.make_dataset(copy, batch_size=8), seconds=60)


def test_metadata_that_is_not_utf8_names_the_file(copy):
    meta = os.path.join(copy, "dataset_info.json")
    with open(meta, "rb") as f:
        data = f.read()
    with open(meta, "wb") as f:
        f.write(data.decode("utf-8").encode("utf-16"))
    with pytest.raises(ValueError, match=rf"{re.escape(meta)} is not usable dataset metadata: .*codec can't decode"):
        ingest.load_info(copy)


def test_metadata_of_the_conversion_still_reads_back(source):
    info = ingest.load_info(source)
    assert info.split("train").records == N and [f.name for f in info.features] == ["id", "x"]


# 4. A split with zero records.


def test_empty_split_is_a_clear_error_naming_it_and_the_splits_with_records(copy):
    meta = os.path.join(copy, "dataset_info.json")
    with open(meta, encoding="utf-8") as f:
        d = json.load(f)
    d["splits"].append({"name": "test", "records": 0, "bytes": 0, "shards": []})
    with open(meta, "w", encoding="utf-8") as f:
        json.dump(d, f)
    with pytest.raises(
        ValueError, match=r"split 'test' of .* has no records.*Splits with records: train \(1000 records\)"
    ):
        ingest.make_dataset(copy, batch_size=8, split="test")
    assert len(_ids(ingest.make_dataset(copy, batch_size=100))) == N


@pytest.mark.parametrize("layout, compression", [("blocks", "none"), ("rows", "gzip")])
def test_each_shard_records_a_fingerprint_of_its_size_and_ends_that_tells_a_same_size_swap(
    tmp_path, layout, compression
):
    # Two conversions of 600 six-digit ints (3-byte varints): same names, counts and sizes, other rows.
    shards = []
    for name, first in (("a", 100_000), ("b", 500_000)):
        src = write_text(tmp_path / f"{name}.csv", "v\n" + "".join(f"{first + 7 * i}\n" for i in range(600)))
        args = ("--layout", layout, "--compression", compression, "--no_shuffle")
        run_convert("--source", "csv", "--input", src, "--output", tmp_path / name, *args)
        (shard,) = ingest.load_info(str(tmp_path / name)).split("train").shards
        data = open(tmp_path / name / shard.filename, "rb").read()
        n = 4096  # the ends: an independent computation of the documented fingerprint
        expected = hashlib.sha256(len(data).to_bytes(8, "little") + data[:n] + data[-n:]).hexdigest()
        assert shard.fingerprint == expected and shard.bytes == len(data)
        shards.append(shard)
    assert shards[0].fingerprint != shards[1].fingerprint
    assert compression == "gzip" or shards[0].bytes == shards[1].bytes  # gzip: sizes differ too
    text = ingest.load_info(str(tmp_path / "a")).to_json()
    assert ingest.DatasetInfo.from_json(text).split("train").shards[0] == shards[0]
    meta = json.loads(text)
    meta["splits"][0]["shards"][0]["fingerprint"] = "lots"
    with pytest.raises(ValueError, match=r"shards\[0\]\.fingerprint must be 64 hexadecimal digits"):
        ingest.DatasetInfo.from_json(json.dumps(meta))
    if compression == "none":  # same name, size and count: only the fingerprint tells the swap, when opened
        shutil.copy(tmp_path / "b" / shards[1].filename, tmp_path / "a" / shards[0].filename)
        orders = [dict(), dict(shuffle=False), dict(cache="memory")]
        orders.append(dict(options=ingest.ReadOptions(symbolic_checkpoint=False)))
        for kwargs in orders:  # the seekable order (the default) checks as it is built, the others at the open
            with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"is not the file the conversion"):
                list(ingest.make_dataset(str(tmp_path / "a"), batch_size=100, **kwargs))
        assert len(list(ingest.make_dataset(str(tmp_path / "b"), batch_size=100))) == 6
