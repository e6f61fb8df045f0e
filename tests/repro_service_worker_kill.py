"""Kills a tf.data service worker mid-epoch and shows what the consumer does.

TensorFlow 2.21's service client can wait forever for the killed worker: before
`make_dataset(service=...)` guarded against it, distributed_epoch stalled in 2 of 3 runs
(after 384-400 of 3000 records) and parallel_epochs in 2 of 2; a shorter task refresh
(task_refresh_interval_hint_ms=300) did not help. Now each run must finish or raise an
error naming the dispatcher within ReadOptions(service_timeout_s) (5 s here);
tests/test_service.py checks this. Not collected by pytest; run:

    .venv/bin/python -m tests.repro_service_worker_kill [distributed_epoch|parallel_epochs] [RUNS]

Prints, per run, whether the epoch finished or raised, and after how long.
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
from tests.test_service import Cluster, _serving  # noqa: E402

TIMEOUT_S = 5


def main(mode: str = "distributed_epoch", runs: str = "3") -> int:
    root = pathlib.Path(tempfile.mkdtemp())
    write_text(root / "in.csv", "id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(3000)))
    run_convert("--source", "csv", "--input", root / "in.csv", "--output", root / "ds", "--num_shards", "6")
    cluster = Cluster(2, dispatcher_args=("--worker_timeout_ms", 3000), worker_args=("--heartbeat_interval_ms", 500))
    hung = 0
    try:
        for run in range(int(runs)):
            ds = ingest.make_dataset(
                str(root / "ds"),
                batch_size=16,
                label=False,
                service=cluster.address,
                processing_mode=mode,
                options=ingest.ReadOptions(service_timeout_s=TIMEOUT_S),
            )
            seen, outcome, start = [], [], time.monotonic()

            def consume():
                try:
                    for i, batch in enumerate(ds):
                        seen.extend(batch["id"].numpy().tolist())
                        if i == 5:
                            cluster.workers[0].kill()
                        time.sleep(0.01)
                    outcome.append(f"finished: {len(seen)} records, {len(set(seen))} distinct")
                except Exception as e:  # noqa: BLE001
                    outcome.append(f"raised {type(e).__name__}: {str(e).splitlines()[0][:300]}")

            t = threading.Thread(target=consume, daemon=True)
            t.start()
            t.join(TIMEOUT_S + 60)
            print(
                f"run {run}: after {time.monotonic() - start:.1f} s, {outcome[0] if outcome else 'STILL WAITING'}",
                flush=True,
            )
            hung += t.is_alive()
            cluster.workers[0] = _serving(cluster.spawn_worker())
    finally:
        cluster.stop()
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
