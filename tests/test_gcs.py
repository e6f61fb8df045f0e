"""gs:// end to end against a real GCS server on loopback (gcp-storage-emulator, see tests/gcs.py).

The conversion writes through Beam's GCS filesystem (google-cloud-storage); the runtime
reads through TensorFlow's built-in GCS filesystem. Nothing in the product knows it is
talking to an emulator.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import ingest
from beam_jobs import _errors, convert
from beam_jobs.convert import ConversionError
from beam_jobs.output import directory as output_dir
from ingest.pipeline import _read
from ingest.pipeline.blocks import index as block_index
from tests.conftest import run_convert
from tests.gcs import LIST_ONLY_BUCKET, GcsEmulator

ROWS = 4000
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    emulator = GcsEmulator(str(tmp_path_factory.mktemp("gcs")))
    patch = pytest.MonkeyPatch()
    for k, v in emulator.env().items():
        patch.setenv(k, v)
    client = emulator.client()
    client.create_bucket("bkt")
    client.bucket("bkt").blob("raw/part-0.csv").upload_from_string(
        "id,x,label\n" + "".join(f"{i},{i * 0.25},{i % 3}\n" for i in range(ROWS))
    )
    yield emulator
    patch.undo()
    emulator.stop()


@pytest.fixture(scope="module")
def converted(gcs):
    info = run_convert(
        "--source",
        "csv",
        "--input",
        "gs://bkt/raw/*.csv",
        "--output",
        "gs://bkt/ds",
        "--label",
        "label",
        "--num_shards",
        "4",
        "--splits",
        "train=0.9,eval=0.1",
    )
    return info


def test_conversion_writes_shards_and_metadata_to_gcs(gcs, converted):
    names = {b.name for b in gcs.client().list_blobs("bkt", prefix="ds/")}
    assert "ds/dataset_info.json" in names
    assert {f"ds/{s.filename}" for split in converted.splits for s in split.shards} <= names
    assert not any("_ingest_tmp" in n for n in names)
    assert sum(s.records for s in converted.splits) == ROWS


def test_runtime_reads_gcs_and_a_model_trains_from_it(converted):
    info = ingest.load_info("gs://bkt/ds")
    assert info.split("train").records + info.split("eval").records == ROWS
    ids = []
    for features, _ in ingest.make_dataset("gs://bkt/ds", batch_size=128, split="train", label="label"):
        ids.extend(features["id"].numpy().tolist())
    for features, _ in ingest.make_dataset("gs://bkt/ds", batch_size=128, split="eval", label="label"):
        ids.extend(features["id"].numpy().tolist())
    assert sorted(ids) == list(range(ROWS))

    ds = ingest.make_dataset(
        "gs://bkt/ds",
        batch_size=64,
        features=["x"],
        label="label",
        num_epochs=None,
        preprocess=lambda f, y: (f["x"][:, None], y),
    )
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(3)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, steps_per_epoch=5, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_opening_a_dataset_downloads_the_block_indexes_of_its_own_shards_not_the_shards(gcs, converted, monkeypatch):
    train = converted.split("train").shards
    assert len(train) == 4 and all(s.index == s.filename + ".index" for s in train)
    for pipelines, mine in ((2, train[1::2]), (1, train)):
        # As in a fresh trainer process: no offsets cached, no shard's fingerprint checked.
        monkeypatch.setattr(block_index, "_offsets_cache", {})
        monkeypatch.setattr(_read, "_fingerprinted", set())
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipelines - 1)
        with gcs.recording() as served:
            ingest.make_dataset("gs://bkt/ds", batch_size=128, split="train", label="label", input_context=ctx)
        downloaded = {r.object for r in served if r.content and r.bytes}
        ends = {f"ds/{s.filename}" for s in mine}  # their fingerprint: a small shard's ends are all of it
        assert downloaded == {"ds/dataset_info.json", *(f"ds/{s.index}" for s in mine), *ends}, pipelines
        # Per shard of this pipeline: its size checked (TensorFlow may have it cached), its
        # index and its ends read; no other shard named. The rest (the metadata, the listing
        # that checks the shards exist) is per dataset.
        named = [r.object for r in served if r.object and r.object.startswith("ds/train-")]
        assert {n.removesuffix(".index") for n in named} == {f"ds/{s.filename}" for s in mine}, named
        assert len(named) <= 3 * len(mine) and len(served) - len(named) <= 6, [r.path for r in served]


def test_images_from_a_manifest_of_gcs_paths(gcs, tmp_path):
    from PIL import Image

    bucket = gcs.client().bucket("bkt")
    for i in range(3):
        buf = io.BytesIO()
        Image.new("RGB", (20 + i, 10), (i * 40, 0, 0)).save(buf, "PNG")
        bucket.blob(f"img/{i}.png").upload_from_string(buf.getvalue())
    bucket.blob("img/manifest.csv").upload_from_string(
        "path,label\n0.png,a\n1.png,b\ngs://bkt/img/2.png,a\nmissing.png,b\n"
    )
    info = run_convert(
        "--source",
        "images",
        "--input",
        "gs://bkt/img/manifest.csv",
        "--output",
        "gs://bkt/img-ds",
        "--max_bad_fraction",
        "0.5",
    )
    assert info.split("train").records == 3 and info.quarantine["reasons"] == {"unreadable": 1}
    images, labels = next(iter(ingest.make_dataset("gs://bkt/img-ds", batch_size=3, image_size=(8, 8), training=False)))
    assert images.shape == (3, 8, 8, 3) and sorted(labels.numpy().tolist()) == [0, 0, 1]


def test_missing_bucket_and_missing_dataset_name_the_path(gcs):
    with pytest.raises(ingest.DatasetNotFoundError, match="gs://no-such-bucket/ds"):
        ingest.make_dataset("gs://no-such-bucket/ds", batch_size=8)
    with pytest.raises(ConversionError, match="gs://no-such-bucket/raw"):
        run_convert("--source", "csv", "--input", "gs://no-such-bucket/raw/*.csv", "--output", "gs://bkt/never")


def test_permission_denied_is_a_clear_error(gcs):
    # IAM is not emulated: the TLS relay answers 403 for this bucket, as GCS would.
    with pytest.raises(
        PermissionError, match=r"(?s)permission denied reading the dataset at gs://forbidden/ds: .*403.*objectViewer"
    ):
        ingest.load_info("gs://forbidden/ds")
    with pytest.raises(PermissionError, match="gs://forbidden/ds"):
        ingest.make_dataset("gs://forbidden/ds", batch_size=8)


@pytest.mark.parametrize(
    "source, refused, path",
    [
        ("csv", "--input", "gs://forbidden/raw/*.csv"),  # listed
        ("images", "--input", "gs://forbidden/manifest.csv"),  # read whole
        ("csv", "--output", "gs://forbidden/ds"),
        ("csv", "--schema", "gs://forbidden/schema.json"),  # read at its first read, not at its open
    ],
)
def test_a_conversion_gcs_refuses_prints_one_line_naming_the_path_and_the_role(
    gcs, tmp_path, capsys, source, refused, path
):
    local = tmp_path / "a.csv"
    local.write_text("id,label\n1,0\n")
    paths = {"--input": str(local), "--output": str(tmp_path / "out"), refused: path}
    code = convert.main(["--source", source, "--label", "label", *(a for kv in paths.items() for a in kv)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1
    role = {"--output": "roles/storage.objectAdmin"}.get(refused, "roles/storage.objectViewer")
    assert errors[0].startswith(f"error: permission denied on {refused} {paths[refused]}: 403 ingest-test@example.com ")
    assert "storage.objects." in errors[0] and role in errors[0] and "application-default login" in errors[0]
    assert "BeamIOError" not in errors[0] and "http://" not in errors[0]
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.fixture(scope="module")
def list_only_inputs(gcs) -> dict:
    """source: (--input, the object refused), in a bucket whose objects can be listed but not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    client = gcs.client()
    bucket = client.create_bucket(LIST_ONLY_BUCKET)
    bucket.blob("raw/a.csv").upload_from_string("id,label\n1,0\n2,1\n")
    parquet = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2], "label": [0, 1]}), parquet)
    bucket.blob("raw/a.parquet").upload_from_string(parquet.getvalue())
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    bucket.blob("img/0.png").upload_from_string(png.getvalue())
    # Readable images beside the refused one, and a bad-record allowance it would fit in.
    for i in (1, 2, 3):
        client.bucket("bkt").blob(f"mixed/{i}.png").upload_from_string(png.getvalue())
    client.bucket("bkt").blob("mixed/manifest.csv").upload_from_string(
        f"path,label\n1.png,a\n2.png,b\n3.png,a\ngs://{LIST_ONLY_BUCKET}/img/0.png,b\n"
    )
    return {
        "csv": (f"gs://{LIST_ONLY_BUCKET}/raw/*.csv", f"gs://{LIST_ONLY_BUCKET}/raw/a.csv"),
        "parquet": (f"gs://{LIST_ONLY_BUCKET}/raw/*.parquet", f"gs://{LIST_ONLY_BUCKET}/raw/a.parquet"),
        "images": ("gs://bkt/mixed/manifest.csv", f"gs://{LIST_ONLY_BUCKET}/img/0.png"),
    }


@pytest.mark.parametrize(
    "detail",
    [
        "{body}",  # an object's metadata: GCS's message
        '{{"error": {{"code": 403, "message": "{body}", "errors": [{{"reason": "forbidden"}}]}}}}: '
        "('Request failed with status code', 403, 'Expected one of', <HTTPStatus.OK: 200>)",  # its content
    ],
)
def test_a_refused_request_is_quoted_by_gcs_message_not_its_url_or_json(detail):
    # google-cloud-storage words a refused download as the URL, GCS's JSON body and the
    # transport's own repetition of the status; a refused metadata read as the URL and the message.
    from google.api_core import exceptions

    body = "a@b.iam does not have storage.objects.get access to the Google Cloud Storage object."
    url = "https://storage.googleapis.com/download/storage/v1/b/x/o/y%2Fz?alt=media"
    error = _errors.storage_error(
        "read", "--input", "gs://x/y/z", exceptions.Forbidden(f"GET {url}: " + detail.format(body=body))
    )
    assert str(error).startswith(f"permission denied on --input gs://x/y/z: 403 {body[:-1]}; grant the account ")
    for noise in ("{", "https://", "Request failed"):
        assert noise not in str(error)


@pytest.mark.parametrize("source", ["csv", "parquet", "images"])
def test_an_input_object_gcs_refuses_to_read_fails_the_job_naming_it_and_the_role(
    list_only_inputs, tmp_path, capsys, source
):
    # Listing is allowed, reading is not (storage.objects.list without storage.objects.get):
    # the job fails on the object, and an image is not quarantined as if it were damaged.
    pattern, refused = list_only_inputs[source]
    out = tmp_path / "out"
    code = convert.main(
        ["--source", source, "--input", pattern, "--output", str(out), "--label", "label", "--max_bad_fraction", "0.5"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1
    assert errors[0].startswith(f"error: permission denied on --input {refused}: 403 ingest-test@example.com ")
    assert "storage.objects.get" in errors[0] and "roles/storage.objectViewer" in errors[0]
    assert "http://" not in errors[0]
    assert not (out / "dataset_info.json").exists() and not list(out.rglob("quarantine/*"))


def test_missing_shard_object_fails_naming_it(gcs, converted):
    client = gcs.client()
    src = client.bucket("bkt").blob("ds/dataset_info.json").download_as_bytes()
    bucket = client.bucket("bkt")
    for blob in client.list_blobs("bkt", prefix="ds/"):
        bucket.copy_blob(blob, bucket, blob.name.replace("ds/", "ds-copy/", 1))
    shard = converted.split("train").shards[1].filename
    bucket.blob(f"ds-copy/{shard}").delete()
    assert src
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=rf"missing: gs://bkt/ds-copy/{shard}"):
        for _ in ingest.make_dataset("gs://bkt/ds-copy", batch_size=256, split="train"):
            pass
    assert time.monotonic() - start < 120


def test_server_going_away_mid_read_fails_in_bounded_time(gcs, tmp_path):
    # 24 MB in 2 shards: far more than TensorFlow's GCS reads buffer ahead.
    blob = "z" * 2000
    local = tmp_path / "big.csv"
    local.write_text("id,blob\n" + "".join(f"{i},{blob}\n" for i in range(12000)))
    run_convert(
        "--source", "csv", "--input", local, "--output", "gs://bkt/big", "--num_shards", "2", "--block_rows", "64"
    )  # fmt: skip
    ds = ingest.make_dataset(
        "gs://bkt/big",
        batch_size=16,
        shuffle=False,
        # One 64-row block per window, so the read streams (the default window would read it all at once).
        options=ingest.ReadOptions(read_buffer_bytes=65536, prefetch=1, block_window=1),
    )
    outcome = {}

    def consume():
        try:
            for i, _ in enumerate(ds):
                if i == 2:
                    gcs.proxy.go_down()
            outcome["result"] = "finished"
        except tf.errors.OpError as e:
            outcome["result"] = e

    t = threading.Thread(target=consume, daemon=True)
    try:
        t.start()
        t.join(timeout=120)
    finally:
        gcs.proxy.down = False
    assert not t.is_alive(), "reading hung after the server went away"
    assert isinstance(outcome["result"], tf.errors.OpError), outcome
    assert "gs://bkt/big/train-" in str(outcome["result"])


def test_a_job_failing_mid_write_leaves_no_metadata_and_a_rerun_succeeds(gcs):
    client = gcs.client()
    bucket = client.bucket("bkt")
    for i in range(3):
        bucket.blob(f"flaky/part-{i}.csv").upload_from_string("a,b\n" + "".join(f"{j},{i}\n" for j in range(500)))
    argv = ["--source", "csv", "--input", "gs://bkt/flaky/*.csv", "--output", "gs://bkt/flaky-ds", "--num_shards", "2"]
    args, beam_args = convert.build_parser().parse_known_args(argv)
    options = convert.PipelineOptions(beam_args)
    cfg = convert.make_config(args, options)
    bucket.blob("flaky/part-2.csv").delete()  # vanishes after launch: a worker fails mid-job
    with pytest.raises(Exception, match="part-2.csv"):
        try:
            convert.build_pipeline(cfg, options).run().wait_until_finish()
        finally:
            output_dir.release(cfg.tmp_dir)  # as convert.run does when the runner raises
    names = {b.name for b in client.list_blobs("bkt", prefix="flaky-ds/")}
    assert "flaky-ds/dataset_info.json" not in names
    with pytest.raises(ingest.DatasetNotFoundError):
        ingest.load_info("gs://bkt/flaky-ds")

    bucket.blob("flaky/part-2.csv").upload_from_string("a,b\n" + "".join(f"{j},2\n" for j in range(500)))
    info = run_convert(*argv)
    assert info.split("train").records == 1500
    names = {b.name for b in client.list_blobs("bkt", prefix="flaky-ds/")}
    assert not any("_ingest_tmp" in n for n in names), names


def test_daily_spans_on_gcs_read_as_one(gcs):
    """Months of real weather converted one by one into gs://bkt/weather/<month>; a fourth
    still converting (no metadata yet) is left out; the latest two are read as one."""
    from tests.conftest import real_csv

    lines = open(real_csv("seattle-weather.csv")).read().splitlines()
    bucket = gcs.client().bucket("bkt")
    rows = {}
    for month in ("2012-01", "2012-02", "2012-03"):
        body = [line for line in lines[1:] if line.startswith(month.replace("-", "/"))]
        rows[month] = sorted(line.split(",")[0] for line in body)
        bucket.blob(f"weather-raw/{month}.csv").upload_from_string("\n".join([lines[0], *body]) + "\n")
        run_convert(
            "--source", "csv", "--input", f"gs://bkt/weather-raw/{month}.csv", "--output", f"gs://bkt/weather/{month}",
            "--label", "weather", "--block_rows", "8",
        )  # fmt: skip
    bucket.blob("weather/2012-04/_ingest_tmp-job/part-0").upload_from_string("half written")
    latest = ingest.spans("gs://bkt/weather", last=2)
    assert latest == ["gs://bkt/weather/2012-02", "gs://bkt/weather/2012-03"]
    dates = [
        d.decode()
        for batch in ingest.make_dataset(latest, batch_size=16, label=False, seed=3)
        for d in batch["date"].numpy().tolist()
    ]
    assert sorted(dates) == sorted(rows["2012-02"] + rows["2012-03"])
    assert ingest.load_info("gs://bkt/weather/2012-0*").split("train").records == sum(map(len, rows.values()))
