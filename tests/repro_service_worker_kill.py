"""Reproduces a tf.data service hang (TF 2.21): a worker killed mid-epoch stalls the consumer.

Not collected by pytest (it hangs). Run: .venv/bin/python -m tests.repro_service_worker_kill [distributed_epoch|parallel_epochs]
Observed here: distributed_epoch stalled in 2 of 3 runs (after 384-400 of 3000 records),
parallel_epochs in 2 of 2; a shorter task refresh (task_refresh_interval_hint_ms=300) did
not help. Printed every 5 s: records seen and whether the consumer is still waiting.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ingest  # noqa: E402
from tests.conftest import run_convert, write_text  # noqa: E402
from tests.test_service import Cluster  # noqa: E402


def main(mode: str = "distributed_epoch") -> int:
    root = pathlib.Path(tempfile.mkdtemp())
    write_text(root / "in.csv", "id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(3000)))
    run_convert("--source", "csv", "--input", root / "in.csv", "--output", root / "ds", "--num_shards", "6")
    cluster = Cluster(2, dispatcher_args=("--worker_timeout_ms", 3000), worker_args=("--heartbeat_interval_ms", 500))
    ds = ingest.make_dataset(str(root / "ds"), batch_size=16, label=False, service=cluster.address, processing_mode=mode)
    seen, start = [], time.monotonic()

    def consume():
        try:
            for i, batch in enumerate(ds):
                seen.extend(batch["id"].numpy().tolist())
                if i == 5:
                    cluster.workers[0].kill()
                time.sleep(0.01)
            print(f"finished: {len(seen)} records, {len(set(seen))} distinct", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"error: {type(e).__name__}: {e}", flush=True)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for _ in range(12):
        t.join(5)
        print(f"t={time.monotonic() - start:.0f}s seen={len(seen)} waiting={t.is_alive()}", flush=True)
        if not t.is_alive():
            break
    cluster.stop()
    os._exit(1 if t.is_alive() else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
