"""The tf.data service: a real dispatcher and workers (`python -m ingest service ...`) on loopback."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import pytest

import ingest
from tests.conftest import run_convert, write_text
from tests.gcs import free_port

ROWS = 3000
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    write_text(root / "in.csv", "id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(ROWS)))
    run_convert("--source", "csv", "--input", root / "in.csv", "--output", root / "ds", "--num_shards", "6")
    return str(root / "ds")


def _start(*args) -> subprocess.Popen:
    """Starts `python -m ingest service ARGS`; returns once it says it is serving."""
    proc = subprocess.Popen([sys.executable, "-m", "ingest", "service", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"ingest service {args} did not start")


class Cluster:
    def __init__(self, workers: int, *, dispatcher_args=(), worker_args=()):
        port = free_port()
        self.address = f"grpc://127.0.0.1:{port}"
        self.dispatcher = _start("dispatcher", "--port", port, *dispatcher_args)
        self.workers = [_start("worker", "--dispatcher", self.address, *worker_args) for _ in range(workers)]

    def stop(self):
        for p in [*self.workers, self.dispatcher]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers, self.dispatcher]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(2)
    yield c
    c.stop()


def _ids(ds) -> list:
    return [int(i) for batch in ds for i in batch["id"].numpy()]


def test_distributed_epoch_delivers_every_record_exactly_once(dataset, cluster):
    ds = ingest.make_dataset(dataset, batch_size=64, label=False, service=cluster.address, processing_mode="distributed_epoch")
    assert sorted(_ids(ds)) == list(range(ROWS))


def test_parallel_epochs_delivers_each_record_once_per_worker(dataset, cluster):
    ds = ingest.make_dataset(dataset, batch_size=64, label=False, service=cluster.address, processing_mode="parallel_epochs")
    counts = collections.Counter(_ids(ds))
    assert set(counts) == set(range(ROWS)) and set(counts.values()) == {2}


def test_service_arguments_are_checked(dataset):
    with pytest.raises(ValueError, match="processing_mode must be one of"):
        ingest.make_dataset(dataset, batch_size=8, service="grpc://127.0.0.1:1", processing_mode="dynamic")
    out = subprocess.run([sys.executable, "-m", "ingest", "service", "dispatcher", "--port", "1", "--fault_tolerant"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "--work_dir" in out.stderr
