"""Steady-state rates on a GPU host's cores (#37, #40): run there by `../shared/device`'s kit.

A long-lived iterator, batches drained in-graph (`next` in a `tf.function` loop), each
variant warmed up, then timed in rounds round robin; medians. Copy this file into
`.dev/kit/` before the kit's calls, and run it under `taskset` per core count:

    probe.py tab DATASET...   make_dataset at batch 4096: the defaults, parse windows at once,
                              and each window's blocks read by its parse call
    probe.py img DATASET...   images/s at 224x224 training crops, batch 256
    probe.py proc DATASET...  ingest.loader with 1, 2 and 4 worker processes (numpy), and
                              make_dataset's batches from 1, 2 and 4 workers into tf.data
                              (design g, in-graph), against make_dataset in-graph, batch
                              4096 and 256 (#45, #46)
    probe.py feed DATASET...  a small MLP's CUDA-graphed train step (bf16, AdamW; widths 256
                              and 1024) fed by ingest.loader(to="torch", device="cuda"), against
                              the same step on a GPU-resident batch (the floor): real idle

All in one call, e.g. (PYTHONPATH=/tmp/site TF_CPP_MIN_LOG_LEVEL=2):
    for c in 0-1 0-3 0-7 0-15; do taskset -c $c python3 .dev/kit/device_probe.py proc .dev/data; done;
    python3 .dev/kit/device_probe.py feed .dev/data

It imports only TensorFlow, ingest and (feed) PyTorch: the GPU machine has no benchmarks package.
"""

import json
import os
import statistics
import sys
import time

import tensorflow as tf

import ingest


def rows_of(b):
    x = b[0] if isinstance(b, tuple) else b
    x = next(iter(x.values())) if isinstance(x, dict) else x
    return tf.shape(x, out_type=tf.int64)[0]


@tf.function
def drain(it, k):
    n = tf.constant(0, tf.int64)
    for _ in tf.range(k):
        n += rows_of(next(it))
    return n


def rate(it, k: int) -> float:
    start = time.perf_counter()
    n = int(drain(it, tf.constant(k)))
    return n / (time.perf_counter() - start)


def measure(makers: dict, k: int, rounds: int = 3) -> dict:
    iterators = {}
    for name, make in makers.items():
        iterators[name] = iter(make())
        rate(iterators[name], max(min(k, 20), k // 4))  # fills the pipeline
    rates = {name: [] for name in iterators}
    for _ in range(rounds):
        for name, it in iterators.items():
            rates[name].append(rate(it, k))
    return {name: round(statistics.median(v)) for name, v in rates.items()}


def tabular(path: str, **options):
    return lambda: ingest.make_dataset(
        path, batch_size=4096, seed=3, num_epochs=None, options=ingest.ReadOptions(**options)
    )


def reading_in_calls(path: str):
    """The defaults with each window's blocks read by its own parse call, not by the one
    read thread (`seekable.READS_IN_WINDOW_CALLS`, read when the dataset is built)."""
    from ingest.pipeline.blocks import seekable

    def make():
        seekable.READS_IN_WINDOW_CALLS = True
        try:
            return tabular(path)()
        finally:
            seekable.READS_IN_WINDOW_CALLS = False

    return make


def loader_rate(path: str, batch_size: int, processes: int, rows: int, text: str = "strings") -> float:
    """Rows/s a Python loop takes from ingest.loader (numpy), after a warm-up of `rows` // 4."""
    with ingest.loader(path, batch_size=batch_size, seed=3, num_epochs=None, processes=processes, text=text) as loader:
        it = iter(loader)
        seen = 0
        while seen < rows // 4:
            seen += len(next(it)[1])
        start, seen = time.perf_counter(), 0
        while seen < rows:
            seen += len(next(it)[1])
        return seen / (time.perf_counter() - start)


def fed_rate(path: str, batch_size: int, processes: int, k: int) -> int:
    """Design (g): make_dataset's batches from `processes` workers into tf.data, in-graph."""
    from ingest.stream import Stream, _tf_feed

    request = dict(batch_size=batch_size, seed=3, num_epochs=None, shuffle=True)
    stream = Stream({"path": path, "request": request}, processes=processes)
    try:
        return measure({"g": lambda: _tf_feed.batches(stream)}, k=k)["g"]
    finally:
        stream.close()


def processes(path: str, batches: int | None) -> list:
    """make_dataset in-graph against ingest.loader with K workers and against design (g),
    on this process's cores."""
    cores = len(os.sched_getaffinity(0))
    out = []
    for b in (4096, 256):
        k = batches or (600 if b == 4096 else 2000)
        made = lambda b=b: ingest.make_dataset(path, batch_size=b, seed=3, num_epochs=None)  # noqa: E731
        rates = {"make_dataset in-graph": measure({"m": made}, k=k)["m"]}
        for workers in (1, 2, 4):
            if workers <= max(1, cores // 2):
                rates[f"loader, {workers} worker(s)"] = round(loader_rate(path, b, workers, rows=k * b))
                rates[f"(g) {workers} worker(s) into tf.data"] = fed_rate(path, b, workers, k)
        out.append({"mode": "proc", "cores": cores, "dataset": path, "batch": b, "rows_per_s": rates})
    return out


def _step(torch, model, opt, sx, sy, cuda: bool) -> tuple:
    """(one train step on the batch in sx, sy: a CUDA graph's replay where there is CUDA;
    a timer of n calls of a function, in seconds a call)."""
    dev = sx.device

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.mse_loss(model(sx).squeeze(-1), sy)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    replay = step
    if cuda:  # the whole step as one CUDA graph, as the fastest trainers run it
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay = graph.replay
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(n, one):
        sync()
        start = time.perf_counter()
        for _ in range(n):
            one()
        sync()
        return (time.perf_counter() - start) / n

    return replay, timed


def feed(path: str, batch_size: int, width: int, workers: int, steps: int | None = None) -> dict:
    """Real idle of a CUDA-graphed MLP step fed by ingest.loader(to="torch", device="cuda")."""
    import torch

    # On a machine without CUDA (the tests) the same loop runs eagerly on the CPU.
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    info = ingest.load_info(path)
    names = [f.name for f in info.features if f.is_scalar and f.dtype != "bytes" and f.name != info.label]
    model = torch.nn.Sequential(
        torch.nn.Linear(len(names), width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=cuda)
    sx, sy = torch.zeros(batch_size, len(names), device=dev), torch.zeros(batch_size, device=dev)

    replay, timed = _step(torch, model, opt, sx, sy, cuda)
    floor = timed(steps or 200, replay)
    n = steps or max(200, int(2.0 / floor))
    floor = timed(n, replay)
    with ingest.loader(
        path,
        batch_size=batch_size,
        seed=1,
        num_epochs=None,
        features=names,
        label=info.label,
        to="torch",
        device=dev,
        processes=workers,
        drop_remainder=True,
    ) as loader:
        it = iter(loader)

        def one():
            x, y = next(it)
            torch.stack([x[k].float() for k in names], dim=1, out=sx)
            sy.copy_(y.float())
            replay()

        timed(min(n, 50), one)
        fed = timed(n, one)
    return {
        "mode": "feed",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "cores": len(os.sched_getaffinity(0)),
        "batch": batch_size,
        "width": width,
        "workers": workers,
        "floor_ms": floor * 1e3,
        "fed_ms": fed * 1e3,
        "idle": max(0.0, 1 - floor / fed),
        "rows_per_s_fed": batch_size / fed,
        "rows_per_s_needed": batch_size / floor,
    }


def main(mode: str, paths: list, batches: int | None = None) -> None:
    cores = len(os.sched_getaffinity(0))
    if mode == "proc":
        for path in paths:
            for line in processes(path, batches):
                print(json.dumps(line), flush=True)
        return
    if mode == "feed":
        for path in paths:
            for b in (4096, 256):
                for width in (256, 1024):
                    for workers in (1, 2, 4):
                        print(json.dumps(feed(path, b, width, workers, steps=batches)), flush=True)
        return
    if mode == "tab":
        for path in paths:
            variants = {"default": tabular(path), "reads in the window calls": reading_in_calls(path)}
            variants |= {
                f"{n} windows at once": tabular(path, num_parallel_calls=n) for n in (4, 8, 16) if n <= 2 * cores
            }
            out = {"mode": mode, "cores": cores, "dataset": path, "rows_per_s": measure(variants, k=batches or 400)}
            print(json.dumps(out), flush=True)
        return

    def images(path):
        return lambda: ingest.make_dataset(
            path, batch_size=256, image_size=(224, 224), training=True, seed=3, num_epochs=None
        )

    makers = {p: images(p) for p in paths}
    print(json.dumps({"mode": mode, "cores": cores, "images_per_s": measure(makers, k=batches or 40)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
