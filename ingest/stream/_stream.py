"""A seekable order's batches, from worker processes or from this one, in one order.

Stream(spec, processes=K)
  K = 0: the windows made here (TensorFlow in this process)
  K > 0: Workers -> window w from worker w % K, read in place from its slot
  -> each window with the rows of the batches it holds (the consumer cuts them: views),
     the first window's leading batches dropped when a pass starts mid-window, the
     stream's count checked
"""

from __future__ import annotations

import random
import threading

from ingest.stream import _transport
from ingest.stream._plan import StreamPlan
from ingest.stream._workers import WorkerError, Workers

__all__ = ["Stream"]


class Stream:
    """Batches of one rank's seekable order; `windows(iteration, start)` is one pass.

    `spec`: {"path": ..., "request": make_dataset's keywords for `_request.build`}; its
    seed is drawn here when None, so every worker shares it.
    """

    def __init__(self, spec: dict, *, processes: int, slots: int = 2, pin: bool = True):
        request = dict(spec["request"])
        if request.get("seed") is None:
            request["seed"] = random.SystemRandom().randrange(1, 2**62)
        self.spec = dict(spec, request=request)
        self.processes = processes
        self.workers = Workers(self.spec, processes, slots=slots, pin=pin) if processes else None
        self.local = None
        self.generation = 0
        self._plan = None
        self._starting = threading.Lock()  # the feeder thread and the caller's len() may both start it

    @property
    def facts(self) -> dict:
        self._start()
        return self._facts

    @property
    def plan(self) -> StreamPlan:
        self._start()
        return self._plan

    def _start(self) -> None:
        with self._starting:
            if self._plan is None:
                self._started()

    def _started(self) -> None:
        if self.workers is None:
            from ingest.stream._worker import _Built

            self.local = _Built(dict(self.spec, worker=0, workers=1))
            facts = self.local.facts()
        else:
            every = self.workers.ready()
            facts = every[0]
        request = self.spec["request"]
        rank_rows = facts["rank_rows"]
        limit = None
        if rank_rows:
            epochs = request.get("num_epochs", 1)
            limit = None if epochs is None else min(_own_batches(r * epochs, request) for r in rank_rows)
        self._facts = facts
        self._plan = StreamPlan(
            batch_size=request["batch_size"],
            window_rows=facts["window_rows"],
            epoch_rows=facts["epoch_rows"],
            num_epochs=request.get("num_epochs", 1),
            drop_remainder=request.get("drop_remainder", False),
            workers=max(self.processes, 1),
            batch_limit=limit,
        )

    def windows(self, iteration: int, start: int, global_seed=None):
        """Pass `iteration` from batch `start`, a window at a time: (its columns, the (first,
        end) rows of each of its batches to deliver); the columns are valid until the next."""
        plan = self.plan
        self.generation += 1
        source = self._local_windows if self.workers is None else self._worker_windows
        b, stop = start, plan.batches
        windows = source(iteration, start, global_seed)
        try:
            for w in plan.windows_from(start):
                got, columns = next(windows, (None, None))
                if got is None:
                    raise WorkerError(
                        f"the stream ended at window {w} of {plan.windows_from(start).stop}: a short epoch"
                    )
                if got != w:
                    raise WorkerError(f"window {got} came where window {w} was due: the workers disagree on the order")
                _check_rows(columns, plan, w)
                ranges = []
                while (stop is None or b < stop) and plan.window_of(b) == w:
                    first = (b - w * plan.batches_per_window) * plan.batch_size
                    ranges.append((first, first + plan.batch_rows(b)))
                    b += 1
                yield columns, ranges
                if stop is not None and b >= stop:
                    break
        finally:
            windows.close()

    def _local_windows(self, iteration, start, global_seed):
        from ingest.stream._worker import _flat

        for w, element in self.local.iterator(iteration, start, global_seed):
            if int(w) >= 0:
                yield int(w), _flat(element)

    def _worker_windows(self, iteration, start, global_seed):
        workers, generation, plan = self.workers, self.generation, self.plan
        for k in range(workers.count):
            workers.send(k, ("iterate", generation, iteration, start, global_seed))
        try:
            for w in plan.windows_from(start):
                k = plan.worker_of(w)
                message = self._next(k, generation)
                if message[0] == "end":
                    return
                _, _, slot, got, placed, _ = message
                yield got, _transport.read(workers.buffers[k][slot], placed)
                workers.send(k, ("free", generation, slot))
        finally:
            if not workers.closed:
                for k in range(workers.count):
                    try:
                        workers.send(k, ("cancel", generation))
                    except WorkerError:
                        pass

    def _next(self, k: int, generation: int):
        """Worker k's next window (or end) of this pass; messages of earlier passes are passed over."""
        while True:
            message = self.workers.receive(k, raise_errors_of=generation)
            if message[0] in ("window", "end") and message[1] == generation:
                return message

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()


def _own_batches(rows: int, request: dict) -> int:
    batch = request["batch_size"]
    return rows // batch if request.get("drop_remainder") else -(-rows // batch)


def _check_rows(columns: list, plan: StreamPlan, w: int) -> None:
    if not columns:
        return
    first = columns[0]
    rows = first.shape[0]
    stream = plan.stream_rows
    want = plan.window_rows if stream is None else min(plan.window_rows, stream - w * plan.window_rows)
    if rows != want:
        raise WorkerError(f"window {w} holds {rows} rows where {want} were due: a short window")
