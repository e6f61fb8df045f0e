"""MultiWorkerMirroredStrategy with two real worker processes on loopback ports."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_convert, write_text
from tests.gcs import free_port

ROWS = 1000


@pytest.mark.slow
def test_two_workers_see_every_record_exactly_once_train_and_resume(tmp, preloaded):
    write_text(tmp / "in.csv", "id,x,label\n" + "".join(f"{i},{i / ROWS},{i % 3}\n" for i in range(ROWS)))
    run_convert(
        "--source", "csv", "--input", tmp / "in.csv", "--output", tmp / "ds", "--label", "label", "--num_shards", "4"
    )
    workers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = []
    for index in range(2):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}),
            "CUDA_VISIBLE_DEVICES": "",
        }
        # Forked from a process that imported TensorFlow once (tests/_preloaded.py): TF_CONFIG
        # and CUDA_VISIBLE_DEVICES are read when the strategy starts the runtime, after the fork.
        procs.append(
            preloaded.popen(
                ["-m", "tests.multiworker_main", tmp / "ds", tmp / f"w{index}.json"], env=env, merge_stderr=True
            )
        )
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    results = [json.load(open(tmp / f"w{i}.json")) for i in range(2)]
    first, second = (set(r["ids"]) for r in results)
    # File-level sharding: each worker reads its own shards; together, every record once.
    assert not first & second
    assert sorted(results[0]["ids"] + results[1]["ids"]) == list(range(ROWS))
    assert first and second
    # Four synchronous training steps: finite losses, and the all-reduce kept the replicas identical.
    assert all(len(r["losses"]) == 4 and all(abs(v) < 1e6 for v in r["losses"]) for r in results)
    assert results[0]["weights"] == results[1]["weights"]
    # Each worker resumed at global step 25 of its own stream, exactly.
    for r in results:
        assert r["resumed"] == r["uninterrupted"][25:40]
    assert not {i for b in results[0]["uninterrupted"] for i in b} & {i for b in results[1]["uninterrupted"] for i in b}
