"""`ingest.loader`: the seekable order's batches for PyTorch, JAX or numpy, resumable by position.

    loader(path, batch_size=..., to=...)        checks its own arguments (no TensorFlow here)
      -> Stream: K worker processes (or this one, processes=0) make windows
      -> a feeder thread: each batch copied once, into the framework's memory
         (numpy: a writable array; torch: a tensor, pinned and sent non-blocking to
         `device`; jax: device_put to `device` or a sharding), `prefetch` batches ahead,
         batches of up to 1024 rows handed over in groups of ~16k rows
      -> the trainer's `for batch in loader`: (features, label) or features

The position is (pass, batch): `state_dict()` is that with the facts that fix the order
(seed, batch size, epochs, rank, the dataset's fingerprint), and `load_state_dict` makes
the next pass resume at the exact next batch, without reading the batches before it.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading

import numpy as np

from ingest.stream._stream import Stream
from ingest.stream._workers import WorkerError

__all__ = ["Loader", "loader"]

_STATE_VERSION = 1
# Windows one process's tf.data makes at once grow little past 8 cores: the numeric corpus
# read 5.4M rows/s on 8 vCPUs of an H100 host and 6.7M on 16 (BENCHMARKS.md, #37). So a
# worker process per 8 usable cores, each pinned to its own.
_CORES_PER_WORKER = 8
_TARGETS = ("numpy", "torch", "jax")


def loader(
    path,
    *,
    batch_size: int,
    split: str = "train",
    features=None,
    label=None,
    label_ids: bool = True,
    shuffle: bool = True,
    seed: int | None = None,
    num_epochs: int | None = 1,
    drop_remainder: bool = False,
    pad_lengths: dict | None = None,
    static_shapes: bool = False,
    text: str = "strings",
    missing: str = "mask",
    options=None,
    rank: int | None = None,
    world_size: int | None = None,
    to: str = "numpy",
    device=None,
    processes: int | None = None,
    prefetch: int = 2,
) -> Loader:
    """An iterable of `(features, label)` batches (or feature dicts) for PyTorch, JAX or numpy.

    The batches are `make_dataset`'s for the same arguments (same seed, same order), made
    by worker processes and handed over as the framework's own arrays. No TensorFlow
    object reaches the caller; the caller's process does not import TensorFlow when
    `processes` > 0. Reads datasets in the blocks layout (the conversion's default).

    Source, batching and shuffling: `path`, `split`, `features`, `label`, `label_ids`,
    `shuffle`, `seed`, `num_epochs`, `drop_remainder`, `pad_lengths`, `static_shapes`,
    `text`, `missing` and `options` as in `ingest.make_dataset` (a feature with missing
    values has its bool NAME_missing beside it). Variable-length features must be padded
    (`pad_lengths` or `static_shapes`): batches are dense arrays. Each `iter()` is a new
    pass over `num_epochs` epochs in a new order, as a new iterator of `make_dataset` is.
    Without a `seed`, one is drawn when the loader is made (kept in its `state_dict`).

    Ranks (data parallel training):
        rank, world_size: this process's part of each epoch: disjoint parts whose union
            is the epoch (whole shards dealt round robin, or blocks with fewer shards than
            ranks). None reads them from `torch.distributed` (when initialized) or
            `jax.process_index()` / `jax.process_count()` (when JAX is imported), else
            0 and 1. Every rank yields the same number of batches per pass (a DDP step
            waits for all): the fewest any rank has; the surplus batches of the larger
            parts at the end of the pass are not yielded (at most one batch a rank, plus
            the rows by which the parts differ, as `DistributedSampler(drop_last=True)`).

    Output:
        to: "numpy" (writable arrays), "torch" (tensors) or "jax" (arrays). Text
            features come as numpy object arrays of bytes with "numpy"; "torch" and "jax"
            need them as ids (`text="ids"`) or left out.
        device: where "torch" or "jax" batches go: a torch device ("cuda:0": copied into
            pinned memory and sent with `non_blocking=True` by the feeder thread, so the
            copy overlaps the step), or a JAX device or sharding (`jax.device_put`). None:
            host memory.
        prefetch: batches made ready ahead of the caller's (of <= 1024 rows: whole groups of ~16k rows).

    Processes:
        processes: worker processes making the stream, kept across passes. They are
            forked from one template process that imports TensorFlow once (a few seconds,
            started in the background when the first loader is made) and serves every
            loader of this process, ending 30 s after its last worker. None: one per 8
            usable cores (at least one). 0: in this process (TensorFlow imported here).
            Linux only for > 0.

    Resume: `state_dict()` -> a small JSON-able dict; `load_state_dict(state)` on a loader
    made with the same arguments continues at the exact next batch. A state from another
    dataset, batch size, seed, epoch count or rank is refused, naming the difference.
    """
    request = {name: value for name, value in locals().items() if name in _MAKE_DATASET_KEYWORDS}
    return _loader_class()(
        path,
        request=request,
        rank=rank,
        world_size=world_size,
        to=to,
        device=device,
        processes=processes,
        prefetch=prefetch,
    )


# The keywords loader passes on to make_dataset's request, as they are.
_MAKE_DATASET_KEYWORDS = frozenset(
    "batch_size split features label label_ids shuffle seed num_epochs drop_remainder pad_lengths static_shapes "
    "text missing options".split()
)


def _loader_class() -> type:
    """Loader, and also a torch `IterableDataset` where torch is imported: `DataLoader` then
    iterates it (batch_size=None) instead of indexing it, and torchdata's `StatefulDataLoader`
    saves its `state_dict`."""
    torch = sys.modules.get("torch")
    if torch is None:
        return Loader
    global _TorchLoader
    if _TorchLoader is None:
        _TorchLoader = type("Loader", (Loader, torch.utils.data.IterableDataset), {"__module__": __name__})
    return _TorchLoader


_TorchLoader = None


def _ranks(rank, world_size) -> tuple:
    """(rank, world_size): as given, else from torch.distributed or JAX when in use, else (0, 1)."""
    if rank is None and world_size is None:
        torch = sys.modules.get("torch")
        jax = sys.modules.get("jax")
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        elif jax is not None:
            rank, world_size = jax.process_index(), jax.process_count()
        else:
            rank, world_size = 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"give rank and world_size together, got rank={rank!r}, world_size={world_size!r}")
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, world_size={world_size}"
        )
    return rank, world_size


def _default_processes() -> int:
    from ingest.pipeline._system import usable_cpus

    return max(1, usable_cpus() // _CORES_PER_WORKER)


class Loader:
    """Made by `ingest.loader`: iterate it for a pass; `state_dict` / `load_state_dict` to resume."""

    def __init__(self, path, *, request, rank, world_size, to, device, processes, prefetch):
        if to not in _TARGETS:
            raise ValueError(f"to must be one of {list(_TARGETS)}, got {to!r}")
        if device is not None and to == "numpy":
            raise ValueError("device is for to='torch' or to='jax'; numpy arrays live in host memory")
        if processes is None:
            processes = _default_processes()
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
            raise ValueError(f"processes must be an int >= 0 (0: this process), got {processes!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        batch_size = request["batch_size"]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.rank, self.world_size = _ranks(rank, world_size)
        self._convert = _converter(to, device)
        self.to, self.device, self.prefetch = to, device, prefetch
        request = dict(request, num_pipelines=self.world_size, pipeline_id=self.rank)
        self._stream = Stream({"path": path, "request": request}, processes=processes)
        self._request = self._stream.spec["request"]
        self._next_pass, self._resume = 0, 0
        self._active = None

    # -- what the order is -------------------------------------------------------------

    @property
    def seed(self) -> int:
        return self._request["seed"]

    def __len__(self) -> int:
        """Batches per pass (num_epochs epochs); TypeError when the stream is endless."""
        batches = self._stream.plan.batches
        if batches is None:
            raise TypeError("an endless loader (num_epochs=None) has no length")
        return batches

    def _identity(self) -> dict:
        r = self._request
        return {
            "seed": r["seed"],
            "batch_size": r["batch_size"],
            "num_epochs": r["num_epochs"],
            "drop_remainder": r["drop_remainder"],
            "rank": self.rank,
            "world_size": self.world_size,
            "fingerprint": self._stream.facts["fingerprint"],
        }

    # -- position ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The position after the last batch the caller took, and what fixes the order."""
        active = self._active
        if active is not None and not active.finished:
            position = {"pass": active.iteration, "batch": active.start + active.taken}
        else:
            position = {"pass": self._next_pass, "batch": self._resume}
        return {"version": _STATE_VERSION, **position, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """The next `iter()` continues where `state` was taken (at its pass and batch)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not an ingest.loader state (version {_STATE_VERSION}): {state!r:.200}")
        mine = self._identity()
        differ = [
            f"{k}: the state has {state.get(k)!r}, this loader {v!r}" for k, v in mine.items() if state.get(k) != v
        ]
        if differ:
            raise ValueError(
                "this state is from another stream, so its position would land elsewhere ("
                + "; ".join(differ)
                + "). Load it into a loader made with the arguments it was saved from"
            )
        self._next_pass, self._resume = int(state["pass"]), int(state["batch"])

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self):
        if self._active is not None:
            self._active.close()
        iteration, start = self._next_pass, self._resume
        self._next_pass, self._resume = iteration + 1, 0
        self._active = _Pass(self, iteration, start)
        return self._active

    def close(self) -> None:
        """Ends the worker processes (also done when the loader is garbage-collected or at exit)."""
        if self._active is not None:
            self._active.close()
        self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        raise TypeError(
            "an ingest.loader holds worker processes and cannot be pickled: give it to "
            "torch.utils.data.DataLoader with num_workers=0 (and batch_size=None); its own processes do the work"
        )

    def _packed(self, columns: list):
        kind, names = self._stream.facts["structure"]
        features = dict(zip(names, columns))
        return (features, columns[-1]) if kind == "pair" else features


class _Pass:
    """One pass: a feeder thread fills a queue of converted batches; `next` takes one."""

    def __init__(self, owner: Loader, iteration: int, start: int):
        self.owner, self.iteration, self.start = owner, iteration, start
        self.taken, self.finished = 0, False
        # Batches cross in groups: a queue hand-off wakes the caller's thread (a few us of
        # locks and a context switch), once a group instead of once a batch.
        group = _group_batches(owner._request["batch_size"])
        self._queue = queue.Queue(max(1, -(-owner.prefetch // group)))
        self._ready = collections.deque()
        self._stop = threading.Event()
        global_seed = _tf_global_seed()
        self._thread = threading.Thread(target=self._feed, args=(global_seed,), daemon=True, name="ingest-loader")
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, global_seed) -> None:
        owner = self.owner
        windows = owner._stream.windows(self.iteration, self.start, global_seed)
        try:
            for columns, ranges in windows:
                for group in owner._convert(columns, ranges):
                    if not self._put(("batches", [owner._packed(batch) for batch in group])):
                        return
            self._put(("end", None))
        except BaseException as e:  # raised in the caller's thread, at its next batch
            self._put(("error", e))
        finally:
            windows.close()

    def __iter__(self):
        return self

    def __next__(self):
        if self._ready:
            self.taken += 1
            return self._ready.popleft()
        if self.finished:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.finished = True
                    raise WorkerError("the loader's feeder thread ended without a word") from None
        if kind == "batches":
            self._ready.extend(value)
            self.taken += 1
            return self._ready.popleft()
        self.finished = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        self.finished = True
        self._stop.set()
        self._thread.join(timeout=10.0)

    def __del__(self):
        self._stop.set()


def _tf_global_seed():
    """TensorFlow's global seed when this process set one (make_dataset's order depends on it)."""
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context

    return context.global_seed()


def _converter(to: str, device):
    """(a window's columns, the (first, end) rows of its batches) -> groups of consecutive
    batches (`_group_batches`), each batch as the framework's arrays: the one copy out of
    the window."""
    if to == "numpy":
        return _in_runs(_slices, lambda columns: [np.array(c) for c in columns])
    if to == "torch":
        return _torch_converter(device)
    return _per_batch(_jax_converter(device))


# Batches are made and handed over in groups of about _GROUP_ROWS rows (at least one
# batch). A group of small batches is one copy a column, cut into the batches' arrays:
# an object costs ~0.17 us for a numpy array and ~0.55 us for a tensor, so 256-row
# batches of 17 columns made one by one cost 19 us a batch in torch against 8.2 as a
# group (numpy one by one: 7-8). Batches over _RUN_BATCH_ROWS are copied one by one:
# a large run's fresh memory faults in page by page (4096-row batches in runs of 8192
# rows: 44 us a batch, one by one 26).
_GROUP_ROWS = 16384
_RUN_BATCH_ROWS = 1024


def _group_batches(batch_size: int) -> int:
    # Larger batches go one by one: a wake-up is little beside their copy (~55 us a
    # 4096-row batch of 17 columns), and a group held at once touches 4x the memory.
    return _GROUP_ROWS // batch_size if batch_size <= _RUN_BATCH_ROWS else 1


def _groups(ranges: list):
    """`ranges` in consecutive groups of `_group_batches` batches (the first batch's size)."""
    if not ranges:
        return
    per = _group_batches(ranges[0][1] - ranges[0][0])
    for i in range(0, len(ranges), per):
        yield ranges[i : i + per]


def _slices(run: np.ndarray, sizes: list) -> list:
    """`run` cut into consecutive views of `sizes` rows (np.split costs ~3x as much a part)."""
    out, first = [], 0
    for size in sizes:
        out.append(run[first : first + size])
        first += size
    return out


def _per_batch(convert):
    """Each batch copied on its own: `convert(its columns' rows)` -> its arrays."""

    def groups(columns, ranges):
        for run in _groups(ranges):
            yield [convert([_rows(c, first, end) for c in columns]) for first, end in run]

    return groups


def _in_runs(cut, one):
    """Batches of up to _RUN_BATCH_ROWS rows copied a group at a time, a column in one copy
    that `cut(copy, sizes)` parts into the batches' arrays; larger batches by `one`."""
    one_by_one = _per_batch(one)

    def groups(columns, ranges):
        if not ranges or ranges[0][1] - ranges[0][0] > _RUN_BATCH_ROWS:
            yield from one_by_one(columns, ranges)
            return
        for run in _groups(ranges):
            sizes = [end - first for first, end in run]
            first, end = run[0][0], run[-1][1]
            parts = [cut(_copy(c, first, end), sizes) for c in columns]
            yield [[p[j] for p in parts] for j in range(len(run))]

    return groups


def _rows(column, first: int, end: int):
    return column[first:end] if isinstance(column, np.ndarray) else column.rows(first, end)


def _copy(column, first: int, end: int) -> np.ndarray:
    """Rows of a window's column in memory of their own (text's rows are made new)."""
    return column[first:end].copy() if isinstance(column, np.ndarray) else column.rows(first, end)


def _no_text(column) -> None:
    if column.dtype == object:
        raise ValueError(
            "text features cannot become torch or jax arrays: read them as ids (text='ids') or leave them "
            "out (features=[...])"
        )


def _torch_converter(device):
    from ingest import _optional

    torch = _optional.torch()
    device = None if device is None else torch.device(device)
    pinned = device is not None and device.type == "cuda"

    def one(columns):
        out = []
        for c in columns:
            _no_text(c)
            if pinned:
                t = torch.empty(c.shape, dtype=torch.from_numpy(c[:0].copy()).dtype, pin_memory=True)
                t.numpy()[...] = c
                out.append(t.to(device, non_blocking=True))
            else:
                t = torch.from_numpy(np.array(c))
                out.append(t if device is None else t.to(device))
        return out

    if device is not None:
        return _per_batch(one)

    def cut(run, sizes):
        _no_text(run)
        return torch.from_numpy(run).split(sizes)

    return _in_runs(cut, one)


def _jax_converter(device):
    from ingest import _optional

    jax = _optional.jax()

    def convert(columns):
        for c in columns:
            _no_text(c)
        return [jax.device_put(c, device) for c in columns]

    return convert
