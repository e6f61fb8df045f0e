"""A stream spread over processes (#45, #46), the 2-core twin of `device_probe.py proc`.

Each design on the numeric corpus and the low-cardinality text one (text as ids for the
consumers that take no strings), batch 4096 and 256, a long-lived iterator timed after a
warm-up of 100k rows, medians of `--rounds` timings:

    (f) make_dataset, consumed in-graph: 1 core (`taskset -c 0`) and 2 cores (`0-1`)
    (a) two processes pinned to a core each, each make_dataset's order over every other
        window (what a process design could give before any hand-off), rates added,
        against (f) on 1 core: this machine's capacity for processes
    (c) make_dataset through a tf.data service of 2 local worker processes, each pinned to a
        core (the streaming order: the service reads no seekable order), against (f) on 2 cores
    (d) one process, 2 sub-pipelines over every other window, each with a private thread
        pool of a core, interleaved window by window, against (f) on 2 cores
    (b) ingest.loader: K worker processes (K = 1 on both cores, K = 2 pinned a core
        each), batches handed over in shared memory and copied once into numpy (or
        torch) in the consumer, against (f) on 2 cores
    (g) make_dataset's batches from K worker processes into tf.data (`ingest.stream._tf_feed`:
        a window a Python call, batches cut in the runtime), consumed in-graph as (f),
        against (f) on 2 cores
    hand-off: what a batch costs from a window in a worker's slot to the consumer's
        numpy arrays (one copy into the slot, one out), us a batch and ns a row

    python -m benchmarks.processes [--rows 500000] [--batch_sizes 4096,256] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import _measure, corpus

_WARMUP_ROWS = 100_000


def _steady_rows(batch_size: int) -> int:
    return 1_000_000 if batch_size >= 1024 else 400_000


def _made(path: str, batch_size: int, text: str, window_slice=None):
    """make_dataset's long-lived pipeline; with `window_slice` (k, K) only its windows w % K == k."""
    import ingest

    if window_slice is None:
        return ingest.make_dataset(path, batch_size=batch_size, seed=3, num_epochs=None, text=text)
    import dataclasses

    from ingest.pipeline import _dataset, _request
    from ingest.pipeline._functions import own_functions
    from ingest.pipeline.blocks import index as block_index
    from ingest.pipeline.blocks import seekable

    req = _request.build(path, batch_size=batch_size, seed=3, num_epochs=None, shuffle=True, text=text)
    req = dataclasses.replace(req, window_slice=tuple(window_slice))
    index = block_index.pipeline_index(
        req.path,
        req.split,
        req.info.block_rows,
        content=str(req.info.source.get("job", "")),
        num_pipelines=1,
        pipeline_id=0,
    )
    with own_functions():
        ds, resume = seekable.positioned_block_batches(req, index)
        ds = _dataset._finished(ds, req, int(index.rows.sum()), seekable=True, resume=resume)
    ds.window_rows = seekable.window_rows(req.info.block_rows, len(index), batch_size)
    return ds


def _sub_pipelines(path: str, batch_size: int, text: str, count: int):
    """(d): `count` sub-pipelines in this process, each over windows w % count == k with a
    private thread pool of its share of the cores, their batches interleaved window by
    window (the order of one pipeline)."""
    import tensorflow as tf

    threads = max(1, len(os.sched_getaffinity(0)) // count)
    parts = []
    for k in range(count):
        part = _made(path, batch_size, text, (k, count))
        per_window = part.window_rows // batch_size
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        parts.append(part.with_options(options))
    pick = tf.data.Dataset.range(2**62).map(lambda i: i // per_window % count)
    return tf.data.Dataset.choose_from_datasets(parts, pick)


def _in_graph(path, batch_size, text, rounds, window_slice=None, sub_pipelines=0) -> list:
    if sub_pipelines:
        ds = _sub_pipelines(path, batch_size, text, sub_pipelines)
    else:
        ds = _made(path, batch_size, text, window_slice)
    return _timed_in_graph(ds, batch_size, rounds)


def _timed_in_graph(ds, batch_size: int, rounds: int) -> list:
    """Rows/s of one long-lived iterator drained in-graph, `rounds` timings after a warm-up."""
    it_rows = _steady_rows(batch_size)
    ds = ds.take(-(-(it_rows * rounds + _WARMUP_ROWS) // batch_size))
    # One long-lived iterator, timed in rounds after its warm-up.
    rates, seen, t = [], 0, None
    import tensorflow as tf

    it = iter(ds)

    @tf.function
    def pull(k):
        n = tf.constant(0, tf.int64)
        for _ in tf.range(k):
            b = next(it)
            n += tf.shape(b[1], out_type=tf.int64)[0]
        return n

    pull(tf.constant(-(-_WARMUP_ROWS // batch_size)))
    for _ in range(rounds):
        t = time.perf_counter()
        seen = int(pull(tf.constant(it_rows // batch_size)))
        rates.append(seen / (time.perf_counter() - t))
    return rates


def _fed_rates(path, batch_size, text, rounds, processes) -> list:
    """(g): the stream of `processes` workers as a tf.data.Dataset, drained in-graph."""
    from ingest.stream import Stream, _tf_feed

    request = dict(batch_size=batch_size, seed=3, num_epochs=None, shuffle=True, text=text)
    stream = Stream({"path": path, "request": request}, processes=processes)
    try:
        return _timed_in_graph(_tf_feed.batches(stream), batch_size, rounds)
    finally:
        stream.close()


def _service_rates(path, batch_size, text, rounds, workers: int = 2) -> list:
    """(c): make_dataset through a tf.data service of `workers` local worker processes, each
    pinned to a core (`python -m ingest service`), consumed in-graph here."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"grpc://127.0.0.1:{port}"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}

    def spawn(cores, *args):
        cmd = ["taskset", "-c", cores, sys.executable, "-m", "ingest", "service", *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    procs = [spawn("0-1", "dispatcher", "--port", str(port))]
    procs += [spawn(str(k % len(os.sched_getaffinity(0))), "worker", "--dispatcher", address) for k in range(workers)]
    try:
        for p in procs:
            while "serving" not in (line := p.stdout.readline()):
                if not line and p.poll() is not None:
                    raise RuntimeError(f"{p.args} did not start")
        import ingest

        ds = ingest.make_dataset(
            path,
            batch_size=batch_size,
            seed=3,
            num_epochs=None,
            text=text,
            service=address,
            processing_mode="parallel_epochs",
        )
        return _timed_in_graph(ds, batch_size, rounds)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def _loader_rates(path, batch_size, text, rounds, processes, to) -> list:
    import ingest

    loader = ingest.loader(path, batch_size=batch_size, seed=3, num_epochs=None, text=text, processes=processes, to=to)
    with loader:
        it = iter(loader)
        seen = 0
        while seen < _WARMUP_ROWS:
            seen += len(next(it)[1])
        rates = []
        for _ in range(rounds):
            t, seen = time.perf_counter(), 0
            while seen < _steady_rows(batch_size):
                seen += len(next(it)[1])
            rates.append(seen / (time.perf_counter() - t))
        workers = loader._stream.workers
        # The template that forked the workers too: its imported pages are shared with them.
        memory = _memory(
            [os.getpid(), workers.template.proc.pid] + [p.pid for p in workers.procs] if processes else [os.getpid()]
        )
    return rates, memory


def _memory(pids: list) -> dict:
    """MB of the processes together: resident (shared slots counted in each process that
    maps them) and proportional (each shared page split among the processes mapping it)."""
    out = {"rss_mb": 0.0, "pss_mb": 0.0}
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[key.lower() + "_mb"] += int(rest.split()[0]) / 1024
    return out


def handoff(batch_size: int, rows: int = 81_920, columns: int = 17, repeats: int = 5) -> dict:
    """us a batch and ns a row from a numeric window to numpy batches through a slot (in one process)."""
    import numpy as np

    from ingest.stream import _loader, _transport

    window = -(-rows // batch_size) * batch_size
    rng = np.random.default_rng(0)
    cols = [rng.random(window, dtype=np.float32) if c % 2 else rng.integers(0, 1000, window) for c in range(columns)]
    placed, size, parts = _transport.layout(cols)
    buffer = _transport.Buffer(size)
    convert = _loader._converter("numpy", None)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        _transport.write(buffer, cols, placed, parts)
        views = _transport.read(buffer, placed)
        ranges = [(b * batch_size, (b + 1) * batch_size) for b in range(window // batch_size)]
        for _ in convert(views, ranges):  # the loader's numpy batches, a group at a time
            pass
        times.append(time.perf_counter() - t)
        del views
    buffer.close()
    s = statistics.median(times)
    return {"us a batch": s / (window // batch_size) * 1e6, "ns a row": s / window * 1e9, "copies": 2}


def _child(args) -> dict:
    p = json.loads(args.paths)[args.corpus]
    text = "ids" if args.corpus == "low" else "strings"
    if args.child == "service":
        rates = _service_rates(p, args.batch_size, text, args.rounds)
    elif args.child == "fed":
        rates = _fed_rates(p, args.batch_size, text, args.rounds, args.processes)
    elif args.child == "graph":
        rates = _in_graph(
            p, args.batch_size, text, args.rounds, json.loads(args.slice) if args.slice else None, args.sub_pipelines
        )
    else:
        rates, memory = _loader_rates(p, args.batch_size, text, args.rounds, args.processes, args.to)
        return {"rate": statistics.median(rates), "rates": rates, **memory}
    return {"rate": statistics.median(rates), "rates": rates}


def _spawn(cores: str, *extra) -> subprocess.Popen:
    cmd = ["taskset", "-c", cores, sys.executable, "-m", "benchmarks.processes", *extra]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"a benchmark child failed ({proc.args})")
    return json.loads(out.strip().splitlines()[-1])


def _designs(common: list) -> dict:
    """design -> rows/s, each child alone on the machine but (a)'s two, which run together."""
    r = {}
    r["(f) make_dataset, 1 core"] = _result(_spawn("0", *common, "--child", "graph"))["rate"]
    r["(f) make_dataset, 2 cores"] = _result(_spawn("0-1", *common, "--child", "graph"))["rate"]
    halves = [_spawn(str(k), *common, "--child", "graph", "--slice", json.dumps([k, 2])) for k in (0, 1)]
    r["(a) 2 processes x 1 core, no hand-off"] = sum(_result(h)["rate"] for h in halves)
    r["(c) tf.data service, 2 local workers x 1 core"] = _result(_spawn("0-1", *common, "--child", "service"))["rate"]
    r["(d) 1 process, 2 sub-pipelines, private pools"] = _result(
        _spawn("0-1", *common, "--child", "graph", "--sub_pipelines", "2")
    )["rate"]
    for k in (1, 2):
        got = _result(_spawn("0-1", *common, "--child", "fed", "--processes", str(k)))
        r[f"(g) make_dataset from {k} worker(s), in-graph"] = got["rate"]
    for k in (1, 2):
        got = _result(_spawn("0-1", *common, "--child", "loader", "--processes", str(k), "--to", "numpy"))
        r[f"(b) loader, {k} worker(s), numpy"] = got["rate"]
        print(f"loader, {k} worker(s): all processes {got['rss_mb']:.0f} MB resident, {got['pss_mb']:.0f} MB PSS")
    r["(b) loader, 2 workers, torch"] = _result(
        _spawn("0-1", *common, "--child", "loader", "--processes", "2", "--to", "torch")
    )["rate"]
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch_sizes", default="4096,256")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, batch 4096, 2 rounds: proves the benchmark runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--paths", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--slice", help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sub_pipelines", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--to", default="numpy", help=argparse.SUPPRESS)
    p.add_argument("--batch_size", type=int, default=4096, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)), flush=True)
        if args.child == "service":
            # TensorFlow's service client can hang the interpreter's exit once its dispatcher
            # is gone; the result is out.
            os._exit(0)
        return 0
    if args.quick:
        args.rows, args.rounds, args.shards, args.batch_sizes = 50_000, 2, 4, "4096"
    paths = {
        t: corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout="blocks", text=t) for t in ("none", "low")
    }
    results = {}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        rows = []
        for name in ("none", "low"):
            common = [
                "--paths",
                json.dumps(paths),
                "--corpus",
                name,
                "--batch_size",
                str(b),
                "--rounds",
                str(args.rounds),
            ]
            rates = _designs(common)
            one, two = rates["(f) make_dataset, 1 core"], rates["(f) make_dataset, 2 cores"]
            for design, rate in rates.items():
                base = one if design.startswith(("(a)", "(f)")) else two
                rows.append({"corpus": name, "design": design, "rows/s": rate, "ratio": rate / base})
        print(
            f"\nProcesses, batch {b}: rows/s (medians of {args.rounds}, long-lived iterators); ratio against "
            "(f) on 1 core for (a) and (f), against (f) on 2 cores for the rest. The low corpus is "
            "read as ids.\n"
        )
        print(_measure.table(rows, ["corpus", "design", "rows/s", "ratio"]), flush=True)
        cost = handoff(b)
        print(f"\nHand-off, batch {b}: {cost['us a batch']:.1f} us a batch, {cost['ns a row']:.2f} ns a row, 2 copies")
        results[b] = {"designs": rows, "handoff": cost}
    _measure.write_json(args.out, "processes.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
