"""A worker process of ingest.stream: `python -m ingest.stream._worker FD`, FD its socket.

    consumer --spec--> build the seekable order's windows once (TensorFlow imported here)
             <--ready (window rows, epoch rows, columns, fingerprint)--
    consumer --iterate (generation, pass number, first batch)--> a new iterator over
             the built graph: windows w with w % K == k, each written into a free slot
             <--window (slot, w, layout)-- ... <--end--
    consumer --free (slot)-- as it finishes with a window; --cancel-- when its iterator
             is dropped; --stop-- (or the socket closing) ends the process.

The worker ends itself when its parent goes: it is started with the parent's pid and
checks it every second, and the socket's closing ends a worker waiting for a slot. A
failure is sent as text (the consumer raises it naming the worker) and the worker waits
for the next command.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import traceback
from multiprocessing import reduction
from multiprocessing.connection import Connection

import numpy as np

from ingest.stream import _plan, _transport

_PASSES = 1 << 30  # as blocks.seekable draws them
_GROWTH = 1.25  # a slot that must grow takes a quarter more than the window that did not fit


def _watch_parent(parent: int) -> None:
    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="ingest-watch-parent").start()


class _Built:
    """The worker's graph, built once: windows of its slice of the order, started per iterator."""

    def __init__(self, spec: dict):
        import tensorflow as tf

        from ingest.pipeline import _dataset, _request
        from ingest.pipeline._functions import own_functions
        from ingest.pipeline.blocks import seekable

        self.tf = tf
        self.start = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.pass_number = tf.Variable(0, dtype=tf.int64, trainable=False)
        req = _request.build(spec["path"], start_batch=self.start, **spec["request"])
        if not seekable.seekable(req):
            raise ValueError(
                f"worker processes read the blocks layout in the seekable order; {req.path} "
                f"({req.info.layout} layout) or these options do not: use processes=0"
            )
        req = dataclasses.replace(req, window_slice=(spec["worker"], spec["workers"]), stream_pass=self.pass_number)
        self.seed = req.seed
        content = str(req.info.source.get("job", ""))
        index, self.rank_rows = _rank_index(req, content)
        with own_functions():
            ds, self.window_rows = seekable.seekable_windows(req, index)
        # No tf.train.Checkpoint ever saves a worker's iterator (the consumer keeps the
        # position): the per-element bookkeeping of symbolic checkpoints is not paid, even
        # where the caller's ReadOptions ask for it.
        options = _dataset._tf_options(req, seekable=True)
        options.experimental_symbolic_checkpoint = False
        self.ds = ds.prefetch(1).with_options(options)
        spec_ = ds.element_spec[1]
        self.structure, specs = _structure(spec_)
        self.columns = [(s.dtype.name, tuple(s.shape[1:])) for _, s in specs]
        ragged = [name for name, s in specs if not isinstance(s, tf.TensorSpec)]
        if ragged:
            raise ValueError(
                f"features {ragged} are variable-length lists: worker processes hand over dense columns. "
                "Give pad_lengths={name: length} (or static_shapes=True) for them"
            )
        self.epoch_rows = int(index.rows.sum())
        self.fingerprint = seekable._fingerprint(index, req.batch_size, self.window_rows, req.shuffle, req.num_epochs)
        self._rand, self._drawn, self._global_seed = None, 0, None

    def facts(self) -> dict:
        """What the consumer needs to know of the order: sent with "ready"."""
        return {
            "window_rows": self.window_rows,
            "epoch_rows": self.epoch_rows,
            "rank_rows": self.rank_rows,
            "structure": self.structure,
            # (dtype, shape past the batch's) a column, for a consumer that declares them
            "columns": self.columns,
            "seed": self.seed,
            "fingerprint": self.fingerprint,
        }

    def pass_of(self, iteration: int, global_seed) -> int:
        """The pass make_dataset's `iteration`-th iterator would draw (blocks.seekable.starts)."""
        tf = self.tf
        if self._rand is None or iteration < self._drawn or global_seed != self._global_seed:
            from tensorflow.python.eager import context

            # Only where it differs: set_seed also resets the op-seed counter, and with
            # processes=0 this is the trainer's own process.
            if context.global_seed() != global_seed:
                tf.random.set_seed(global_seed)
            self._rand = tf.data.Dataset.random(seed=self.seed % 2**31, rerandomize_each_iteration=True)
            self._drawn, self._global_seed = 0, global_seed
        value = None
        while self._drawn <= iteration:
            value = int(next(iter(self._rand)))
            self._drawn += 1
        return value % _PASSES

    def iterator(self, iteration: int, start: int, global_seed):
        self.pass_number.assign(self.pass_of(iteration, global_seed))
        self.start.assign(start)
        return iter(self.ds)


def _structure(spec) -> tuple:
    """An element spec -> (("dict", names) or ("pair", names), [(name, spec)] in flat order)."""
    if isinstance(spec, tuple):
        features, label = spec
        names = sorted(features)
        return ("pair", tuple(names)), [(n, features[n]) for n in names] + [("label", label)]
    names = sorted(spec)
    return ("dict", tuple(names)), [(n, spec[n]) for n in names]


def _flat(element) -> list:
    if isinstance(element, tuple):
        features, label = element
        return [features[n].numpy() for n in sorted(features)] + [label.numpy()]
    return [element[n].numpy() for n in sorted(element)]


def _rank_index(req, content: str) -> tuple:
    """This rank's blocks, and every rank's rows per epoch (None with one rank).

    Ranks read consecutive blocks of the split cut at equal shares of its rows (not whole
    shards: 3 shards over 2 ranks would give one rank twice the other's rows, and every
    rank stops at the fewest batches any has)."""

    from ingest.pipeline.blocks import index as block_index

    whole = block_index.index_split(req.path, req.split, req.info.block_rows, content=content)
    if req.num_pipelines == 1:
        return whole, None
    parts = _plan.rank_blocks(whole.rows, req.num_pipelines)
    rows = [int(whole.rows[a:b].sum()) for a, b in parts]
    first, stop = parts[req.pipeline_id]
    return whole.take(np.arange(first, stop)), rows


class _Serving:
    """The command loop: one iterator at a time, windows into free slots."""

    def __init__(self, conn: Connection, built: _Built, slots: int):
        self.conn, self.built = conn, built
        self.buffers = [None] * slots
        self.free: list = []
        self.generation = -1
        self.cancelled = False

    def handle(self, message) -> None:
        kind = message[0]
        if kind == "stop":
            sys.exit(0)
        if kind == "free" and message[1] == self.generation:
            self.free.append(message[2])
        elif kind == "cancel" and message[1] == self.generation:
            self.cancelled = True
        elif kind == "iterate":  # only between passes: a pass in progress reads until it is cancelled
            self.run(*message[1:])

    def run(self, generation: int, iteration: int, start: int, global_seed) -> None:
        self.generation, self.cancelled = generation, False
        self.free = list(range(len(self.buffers)))[::-1]
        try:
            for w, element in self.built.iterator(iteration, start, global_seed):
                while not self.cancelled and self.conn.poll():
                    self.handle(self.conn.recv())
                if self.cancelled:
                    break
                if w < 0:
                    continue
                self.send_window(int(w), _flat(element))
                if self.cancelled:
                    break
        except Exception as e:  # sent, not raised: the consumer raises it, naming this worker
            self.conn.send(
                ("error", generation, f"{type(e).__name__}: {_message(e)}", traceback.format_exc(), _kind(e))
            )
            return
        self.conn.send(("end", generation))

    def send_window(self, w: int, columns: list) -> None:
        while not self.free and not self.cancelled:
            self.handle(self.conn.recv())
        if self.cancelled:
            return
        slot = self.free.pop()
        placed, size, parts = _transport.layout(columns)
        buffer, grown = self.buffers[slot], None
        if buffer is None or buffer.size < size:
            if buffer is not None:
                buffer.close()
            size = -(-int(size * _GROWTH) // 4096) * 4096
            buffer = self.buffers[slot] = _transport.Buffer(max(size, 4096))
            grown = buffer.size
        _transport.write(buffer, columns, placed, parts)
        self.conn.send(("window", self.generation, slot, w, placed, grown))
        if grown is not None:
            reduction.send_handle(self.conn, buffer.fd, os.getppid())


def _message(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _kind(e: Exception) -> str:
    """How the consumer raises it: a wrong argument or a missing file as what it is."""
    if isinstance(e, FileNotFoundError):
        return "FileNotFoundError"
    return "ValueError" if isinstance(e, ValueError) else "WorkerError"


def _pin(cores) -> None:
    if cores:
        try:
            os.sched_setaffinity(0, cores)
        except (AttributeError, OSError):
            pass


def main(fd: int, parent: int) -> None:
    _watch_parent(parent)
    conn = Connection(fd)
    try:
        spec = conn.recv()
    except EOFError:
        return
    _pin(spec.get("cores"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        built = _Built(spec)
    except Exception as e:
        conn.send(("error", -1, _message(e), traceback.format_exc(), _kind(e)))
        return
    conn.send(("ready", built.facts()))
    serving = _Serving(conn, built, spec["slots"])
    try:
        while True:
            serving.handle(conn.recv())
    except (EOFError, OSError):  # the consumer went
        return


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
