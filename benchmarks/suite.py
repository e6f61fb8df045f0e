"""The idle-time benchmark suite: scenarios from the reference material, each pipeline
fed to the same simulated accelerator, on the same data, in the same run.

    python -m benchmarks [--quick] [--out DIR]

Scenarios:
  prefetch  a 20 ms step and a 15 ms load (the reference's 200 vs 150): idle without
            prefetch, and with it
  formats   the step is twice make_dataset's own per-batch time; every pipeline (naive,
            CSV read directly, Parquet read directly, the guide's recipe, the same tuned by
            hand, make_dataset) feeds it
  slow_storage  shards behind a 20 ms per-read latency (a FUSE mirror), read with
            interleave widths 1, 4 and 16
  cache     the second epoch, with and without make_dataset's cache
  layouts   the shortest step make_dataset keeps <= 1% idle, on the row records and on
            the blocks layout of the same rows (a sweep from 6 ms down, x0.8 a step)
  images    224x224 training batches of 500x375 JPEGs (random resized crop + flip) at a
            step 1.25x make_dataset's own per-batch time: a naive Pillow loop, the
            hand-written tf.data pipeline (decode, then crop), make_dataset (fused decode)
Writes DIR/results.json, DIR/idle_by_scenario.png, DIR/wait_timeline.png,
DIR/layouts_sweep.png and prints a markdown table.
"""

from __future__ import annotations

import dataclasses
import os

from benchmarks import _measure, _noise, _plots, corpus

BATCH = 256


@dataclasses.dataclass(frozen=True)
class SuiteData:
    dataset: str
    csv: str
    parquet: str
    records: int


def prepare(workdir: str, rows: int) -> SuiteData:
    return SuiteData(
        corpus.ensure_dataset(workdir, rows, 16),
        corpus.ensure_csv(workdir, rows),
        corpus.ensure_parquet(workdir, rows),
        rows,
    )


def _record(scenario: str, pipeline: str, report) -> dict:
    s = report.summary()
    return {
        "scenario": scenario,
        "pipeline": pipeline,
        "idle_fraction": s["idle_fraction"],
        "examples_per_sec": s["examples_per_sec"],
        "step_time_ms": s["step_time_ms"],
        "steps": s["steps"],
        "classification": s["classification"],
        "wait_p99_ms": s["wait_p99_ms"],
        "warmup_wait_s": s["warmup_wait_s"],
    }


# The pipelines a verdict compares are measured this many times each (--quick: 2): the
# verdict weighs their spread, not one run's luck.
REPEATS = 3
COMPARED = ("make_dataset", "best_practice", "tuned_by_hand")


def _repeated(scenario: str, pipeline: str, reports: list) -> dict:
    """The record of the run with the median idle, and every run's idle beside it."""
    idles = [r.idle_fraction for r in reports]
    middle = sorted(range(len(reports)), key=lambda i: idles[i])[(len(reports) - 1) // 2]
    return {**_record(scenario, pipeline, reports[middle]), "idle_fractions": idles}


def _tail(report, start: int):
    """The report restricted to steps from `start` on (e.g. a second epoch)."""
    from ingest import IdleReport

    return IdleReport(report.waits[start:], report.computes[start:], 0, report.examples, report.wall_seconds)


def run(
    out: str,
    *,
    quick: bool,
    workdir: str,
    repeats: int | None = None,
    rows: int | None = None,
    steps: int | None = None,
    images: int | None = None,
) -> list:
    """Every scenario; `repeats`: runs of each compared pipeline (None: 2 with `quick`, else
    REPEATS); `rows`: of the tabular corpus (None: 50,000 with `quick`, else 500,000);
    `steps`: measured a tabular pipeline (None: 80 with `quick`, else 400); `images`: of the
    image corpus (None: 300 with `quick`, else 2,000)."""
    _plots.pyplot()  # without matplotlib, stop before the work rather than after it
    import ingest
    from benchmarks import pipelines

    data = prepare(workdir, rows or (50_000 if quick else 500_000))
    steps = steps or (80 if quick else 400)
    results, timelines = [], {}

    for prefetch in (False, True):
        ds = pipelines.synthetic_load(load_ms=15, prefetch=prefetch, steps=steps // 4 + 5)
        report = ingest.measure_idle(ds, step_time_ms=20, warmup_steps=5, depth=2 if prefetch else 1)
        results.append(_record("prefetch", "with_prefetch" if prefetch else "without_prefetch", report))

    _measure.drain(ingest.make_dataset(data.dataset, batch_size=BATCH))
    n, seconds = _measure.drain(ingest.make_dataset(data.dataset, batch_size=BATCH))
    step_ms = 2 * 1000 * seconds / (n / BATCH)
    makers = {
        "naive": lambda: pipelines.naive(data.dataset, batch_size=BATCH).repeat(),
        "csv_direct": lambda: pipelines.csv_direct(data.csv, batch_size=BATCH).repeat(),
        "parquet_direct": lambda: pipelines.parquet_direct(data.parquet, batch_size=BATCH).repeat(),
        "best_practice": lambda: pipelines.best_practice(data.dataset, batch_size=BATCH).repeat(),
        "tuned_by_hand": lambda: pipelines.tuned_by_hand(data.dataset, batch_size=BATCH).repeat(),
        "make_dataset": lambda: ingest.make_dataset(data.dataset, batch_size=BATCH, num_epochs=None),
    }
    repeats = repeats or (2 if quick else REPEATS)
    for name, make in makers.items():
        reports = [
            ingest.measure_idle(make(), step_time_ms=step_ms, steps=steps, warmup_steps=20)
            for _ in range(repeats if name in COMPARED else 1)
        ]
        results.append(_repeated("formats", name, reports))
        timelines[name] = [1000 * w for w in reports[0].waits]

    results += _slow_storage(data, step_ms, steps, out)

    epoch_steps = -(-data.records // BATCH)
    second_epoch = {
        "make_dataset cache=None": lambda: ingest.make_dataset(data.dataset, batch_size=BATCH, num_epochs=2),
        "make_dataset": lambda: ingest.make_dataset(data.dataset, batch_size=BATCH, num_epochs=2, cache="memory"),
        "best_practice": lambda: pipelines.best_practice(data.dataset, batch_size=BATCH, cache=True).repeat(2),
        "tuned_by_hand": lambda: pipelines.tuned_by_hand(data.dataset, batch_size=BATCH, cache=True).repeat(2),
    }
    for name, make in second_epoch.items():
        reports = [
            _tail(ingest.measure_idle(make(), step_time_ms=step_ms, warmup_steps=0), epoch_steps)
            for _ in range(repeats if name in COMPARED else 1)
        ]
        results.append(_repeated("cache", name, reports))

    results += _layouts(workdir, data.records, steps)
    results += _images(workdir, quick=quick, count=images)

    _measure.write_json(out, "results.json", results)
    _draw(results, timelines, out, step_ms)
    return results


# Steps tried for the shortest-step sweep, longest first (ms); each is 0.8x the one before.
_SWEEP_MS = tuple(round(6.0 * 0.8**i, 3) for i in range(16))
IDLE_TARGET = 0.01


def _layouts(workdir: str, rows: int, steps: int) -> list:
    """The shortest simulated step each record layout keeps <= 1% idle: steps are tried
    from long to short until one is more than 1% idle; the last one under is the answer."""
    import ingest

    results = []
    for layout in ("rows", "blocks"):
        path = corpus.ensure_dataset(workdir, rows, 16, layout=layout)
        shortest, sweep = None, []
        # One build a layout, a new iterator a step: the build is no part of the idle, and
        # building anew for each of up to 16 steps was half of the sweep's time.
        ds = ingest.make_dataset(path, batch_size=BATCH, num_epochs=None)
        for step_ms in _SWEEP_MS:
            report = ingest.measure_idle(ds, step_time_ms=step_ms, steps=steps, warmup_steps=20)
            sweep.append([step_ms, report.idle_fraction])
            if report.idle_fraction > IDLE_TARGET:
                break
            shortest = step_ms
        results.append(
            {
                "scenario": "layouts",
                "pipeline": f"make_dataset, {layout}",
                "shortest_step_ms_at_1pct_idle": shortest,
                "sweep": sweep,
            }
        )
    return results


def _images(workdir: str, *, quick: bool, count: int | None) -> list:
    """Image decode as the input bottleneck of a ResNet-style classifier."""
    import glob

    import numpy as np

    import ingest
    from benchmarks import images

    count = count or (300 if quick else 2000)
    root = corpus.ensure_images(workdir, count)
    files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    dataset = os.path.join(workdir, f"images-ds-{os.path.basename(root)}")
    if not os.path.exists(os.path.join(dataset, "dataset_info.json")):
        images.convert_images(root, dataset)

    def ours():
        return ingest.make_dataset(dataset, batch_size=images.BATCH, image_size=images.SIZE, num_epochs=None)

    rate, _ = images.steady_rate(ours(), warmup=5, measured=10 if quick else 40)
    step_ms = 1.25 * 1000 * images.BATCH / rate
    steps = 15 if quick else 60
    # Ten warm-up steps of the naive Pillow loop were most of the quick run's image time.
    warmup = 3 if quick else 10
    makers = {
        "naive": lambda: images.naive_batches(files, np.random.default_rng(0)),
        "hand_written": lambda: images.hand_written(files),
        "make_dataset": ours,
    }
    return [
        _record("images", name, ingest.measure_idle(make(), step_time_ms=step_ms, steps=steps, warmup_steps=warmup))
        for name, make in makers.items()
    ]


SLOW_READ_MS = 20  # per read request: object-storage first-byte latency


def _slow_storage(data: SuiteData, step_ms: float, steps: int, out: str) -> list:
    """Shards behind a per-read latency (a FUSE mirror); the effect of interleave width."""
    import ingest
    from benchmarks import pipelines, slowfs

    reason = slowfs.unavailable_reason()
    if reason:
        return [{"scenario": "slow_storage", "pipeline": "unavailable", "reason": reason}]
    rows = []
    with slowfs.mounted(data.dataset, os.path.join(os.path.abspath(out), "slow-mount"), SLOW_READ_MS) as mnt:
        # Reads that wait on latency need threads, not cores: the last variant gives each
        # of the 16 readers its own call instead of AUTOTUNE's core-sized pool.
        for width, calls in ((1, None), (4, None), (16, None), (16, 16)):
            opts = ingest.ReadOptions(cycle_length=width, num_parallel_calls=calls)
            ds = ingest.make_dataset(mnt, batch_size=BATCH, num_epochs=None, options=opts)
            report = ingest.measure_idle(ds, step_time_ms=step_ms, steps=steps, warmup_steps=20)
            name = f"make_dataset cycle_length={width}" + (f" num_parallel_calls={calls}" if calls else "")
            rows.append(_record("slow_storage", name, report))
        for name, make in (("best_practice", pipelines.best_practice), ("tuned_by_hand", pipelines.tuned_by_hand)):
            report = ingest.measure_idle(
                make(mnt, batch_size=BATCH).repeat(), step_time_ms=step_ms, steps=steps, warmup_steps=20
            )
            rows.append(_record("slow_storage", name, report))
        # make_dataset with its defaults, for the comparison with the hand-written ones.
        report = ingest.measure_idle(
            ingest.make_dataset(mnt, batch_size=BATCH, num_epochs=None),
            step_time_ms=step_ms,
            steps=steps,
            warmup_steps=20,
        )
        rows.append(_record("slow_storage", "make_dataset", report))
    return rows


def _draw(results: list, timelines: dict, out: str, step_ms: float) -> None:
    plt = _plots.pyplot()
    sweeps = {r["pipeline"]: r["sweep"] for r in results if "sweep" in r}
    results = [r for r in results if "idle_fraction" in r]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{r['scenario']}\n{r['pipeline']}" for r in results]
    bars = ax.bar(
        range(len(results)),
        [100 * r["idle_fraction"] for r in results],
        color=[
            {
                "prefetch": "tab:gray",
                "formats": "tab:blue",
                "slow_storage": "tab:orange",
                "cache": "tab:green",
                "images": "tab:purple",
            }[r["scenario"]]
            for r in results
        ],
    )
    ax.bar_label(bars, fmt="%.1f%%", fontsize=8)  # zero-height bars still show their value
    ax.set_xticks(range(len(results)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("accelerator idle (% of step time)")
    ax.set_title("Idle time per pipeline and scenario")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "idle_by_scenario.png"), dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, waits in timelines.items():
        ax.plot(waits, label=name, linewidth=1)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("wait before the step (ms)")
    ax.set_title(f"formats scenario: per-step wait, {step_ms:.2f} ms steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "wait_timeline.png"), dpi=120)
    plt.close(fig)
    if sweeps:
        _draw_sweeps(plt, sweeps, out)


def _draw_sweeps(plt, sweeps: dict, out: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in sweeps.items():
        steps, idle = zip(*points)
        ax.plot(steps, [100 * i for i in idle], marker="o", label=name)
    ax.axhline(100 * IDLE_TARGET, color="gray", linestyle="--", linewidth=1, label="1% idle")
    ax.set_xscale("log")
    tried = sorted({step for points in sweeps.values() for step, _ in points})
    ax.set_xticks(tried, [f"{t:.2g}" for t in tried], fontsize=8)
    ax.minorticks_off()
    ax.invert_xaxis()  # shorter steps (faster models) to the right
    ax.set_xlabel("simulated accelerator step (ms, log scale)")
    ax.set_ylabel("accelerator idle (%)")
    ax.set_title("layouts: idle as the step shortens, same rows, batch 256")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "layouts_sweep.png"), dpi=120)
    plt.close(fig)


def table(results: list) -> str:
    rows = [_table_row(r) for r in results]
    return _measure.table(
        rows, ["scenario", "pipeline", "idle_%", "classification", "examples_per_sec", "step_time_ms", "steps"]
    )


def _table_row(r: dict) -> dict:
    if "idle_fraction" in r:
        return {**r, "idle_%": 100 * r["idle_fraction"]}
    if "sweep" in r:
        shortest = r["shortest_step_ms_at_1pct_idle"]
        said = f"<= 1% idle down to {shortest} ms steps" if shortest else "over 1% idle at every step tried"
        return {**r, "classification": said, "step_time_ms": shortest}
    return {**r, "classification": r["reason"]}


def verdicts(results: list) -> str:
    """Per scenario: make_dataset's idle against the best hand-written pipeline's, each with
    its spread over repeats; "WORSE" only when the two ranges are apart by more than the
    noise floor (`_noise.compare`)."""
    lines = []
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        rows = {r["pipeline"]: r for r in results if r["scenario"] == scenario and "idle_fraction" in r}
        hand = [p for p in ("best_practice", "tuned_by_hand") if p in rows]
        if "make_dataset" not in rows or not hand:
            continue
        runs = {p: rows[p].get("idle_fractions") or [rows[p]["idle_fraction"]] for p in ("make_dataset", *hand)}
        best = min(hand, key=lambda p: _noise.spread(runs[p]).median)
        ours, theirs = _noise.spread(runs["make_dataset"]), _noise.spread(runs[best])
        lines.append(
            f"{scenario}: make_dataset {ours} idle vs best hand-written ({best}) {theirs}"
            f" -> {_noise.compare(runs['make_dataset'], runs[best])}"
        )
    return "\n".join(lines)
