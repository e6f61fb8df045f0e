"""Small measurement helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import weakref


def batch_rows(batch) -> int:
    """Rows in a batch: of the label in `(features, label)`, else of the tensor itself."""
    return int((batch[1] if isinstance(batch, tuple) else batch).shape[0])


def drain(ds, count_of=batch_rows) -> tuple:
    """Iterates a dataset once; returns (examples, seconds)."""
    start = time.perf_counter()
    n = 0
    for batch in ds:
        n += count_of(batch)
    return n, time.perf_counter() - start


def _add_rows(n, batch):
    import tensorflow as tf

    rows = batch[1] if isinstance(batch, tuple) else batch
    return n + tf.shape(rows, out_type=tf.int64)[0]


_LOOPS = weakref.WeakKeyDictionary()  # dataset -> its compiled loop


def drain_in_graph(ds) -> tuple:
    """Iterates a dataset once inside the TensorFlow runtime; returns (examples, seconds).

    A trainer's compiled step (`tf.function`, Keras `fit`) takes batches without a Python
    round trip; a Python loop costs ~0.1-0.3 ms per batch of 21 tensors, which caps any
    pipeline near 1,000 batches/s and would hide the differences being measured.

    The loop (a `Dataset.reduce` in a `tf.function`) is traced once per dataset and each
    call makes a new iterator, as Keras' fit traces its step once and iterates a finite
    dataset anew each epoch: a reduce traced per call cost ~15 ms of a ~150 ms epoch here
    (tracing its function, then instantiating it), which no trainer pays.
    """
    import tensorflow as tf

    loop = _LOOPS.get(ds)
    if loop is None:
        loop = _LOOPS[ds] = tf.function(lambda: ds.reduce(tf.constant(0, tf.int64), _add_rows))
    start = time.perf_counter()
    n = int(loop())
    return n, time.perf_counter() - start


def drain_steady_in_graph(ds, *, warmup_batches: int) -> tuple:
    """Like drain_in_graph, but times only what follows the first `warmup_batches` batches;
    returns (examples after them, seconds after them).

    The steady state of a long-lived iterator: the clock starts in the graph when batch
    `warmup_batches` arrives, so iterator creation and the first windows are not in it.
    """
    import tensorflow as tf

    def add(state, batch):
        n, k, started = state
        rows = batch[1] if isinstance(batch, tuple) else batch
        k = k + 1
        started = tf.where(tf.equal(k, warmup_batches), tf.timestamp(), started)
        counted = tf.where(k > warmup_batches, tf.shape(rows, out_type=tf.int64)[0], tf.constant(0, tf.int64))
        return n + counted, k, started

    zero = tf.constant(0, tf.int64)
    n, k, started = ds.reduce((zero, zero, tf.constant(0.0, tf.float64)), add)
    end = time.time()  # the same clock as tf.timestamp
    if int(k) <= warmup_batches:
        raise ValueError(f"the dataset gave {int(k)} batches, not more than the {warmup_batches} of warm-up")
    return int(n), end - float(started)


def median_rate(make, *, runs: int, warmup: int = 1) -> dict:
    """Examples/s of `make()` datasets: warm-up runs are reported apart from the median."""
    warm = [drain(make()) for _ in range(warmup)]
    measured = [drain(make()) for _ in range(runs)]
    rates = [n / s for n, s in measured]
    return {
        "examples": measured[0][0],
        "examples_per_sec": statistics.median(rates),
        "runs": rates,
        "warmup_examples_per_sec": [n / s for n, s in warm],
    }


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler:
    """Peak RSS growth over a block of code, sampled every 20 ms in a thread.

    Sampled rather than read from ru_maxrss: Linux carries ru_maxrss across fork and
    exec, so a child started by a big parent reports the parent's peak.
    """

    def __enter__(self):
        import threading

        self.start_mb = current_rss_mb()
        self.peak_mb = self.start_mb
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(0.02):
                self.peak_mb = max(self.peak_mb, current_rss_mb())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, current_rss_mb())

    @property
    def growth_mb(self) -> float:
        return self.peak_mb - self.start_mb


def descendants(root: int) -> list:
    """`root` and every process below it, from /proc (each process's parent in its stat)."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone, or a kernel thread's odd name
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


class TreeSampler:
    """Peak RSS of this process and all its descendants together, and each one's CPU
    seconds, sampled every 50 ms in a thread: what a job that starts worker processes
    (Beam's multi-process DirectRunner) costs in all. A process's CPU is its last
    sample's (a worker's final ~50 ms may be missed); `cpu_s` groups them by role. RSS is
    whole processes: this one's includes what ran in it before the block, and a worker
    of an earlier job still exiting is counted."""

    def __init__(self, role_of=lambda cmdline: "child"):
        self._role_of = role_of

    def __enter__(self):
        import threading

        self.peak_mb = 0.0
        self.peak_mb_by_role: dict = {}  # role -> peak of its processes' RSS together
        self._cpu: dict = {}  # pid -> (role, CPU seconds at the last sample)
        self._start_cpu: dict = {}  # pid -> its CPU seconds when the block began, if it ran then
        for pid in descendants(os.getpid()):
            try:
                self._start_cpu[pid] = self._cpu_of(pid)
            except OSError:
                continue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while True:
            self._sample()
            if self._stop.wait(0.05):
                return

    @staticmethod
    def _cpu_of(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _sample(self):
        total, me, by_role = 0, os.getpid(), {}
        for pid in descendants(me):
            try:
                with open(f"/proc/{pid}/statm") as f:
                    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                cpu = self._cpu_of(pid)
                if self._cpu.get(pid, ("other",))[0] == "other":  # new, or caught before its exec
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        role = "job" if pid == me else self._role_of(f.read().replace(b"\0", b" ").decode())
                    self._cpu[pid] = (role, cpu)
                self._cpu[pid] = (self._cpu[pid][0], cpu)
            except OSError:  # exited between the listing and the read
                continue
            total += rss
            by_role[self._cpu[pid][0]] = by_role.get(self._cpu[pid][0], 0) + rss
        self.peak_mb = max(self.peak_mb, total / 2**20)
        for role, rss in by_role.items():
            self.peak_mb_by_role[role] = max(self.peak_mb_by_role.get(role, 0.0), rss / 2**20)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def cpu_s(self) -> dict:
        """CPU seconds by role over the block ("job": this process, the sampler's own
        thread included); a process that ran before the block counts from its start."""
        out: dict = {}
        for pid, (role, cpu) in self._cpu.items():
            out[role] = out.get(role, 0.0) + cpu - self._start_cpu.get(pid, 0.0)
        return out


def run_child(module: str, *args) -> dict:
    """Runs `python -m module args` and returns the JSON it prints last (own process: own peak RSS)."""
    out = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_json(out_dir: str, filename: str, results, *, indent: int = 2) -> None:
    """A benchmark's results as `out_dir/filename`, the directory made if need be."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, filename), "w") as f:
        json.dump(results, f, indent=indent)


def table(rows: list, columns: list) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)
