"""The consumer's side of the worker processes: start them, hear from them, end them.

A worker is a plain `python -m ingest.stream._worker` process (not multiprocessing's
spawn, which would import the trainer's `__main__` again in every worker) holding one end
of a socket pair. A worker that dies closes its end: the consumer's next read of it gets
EOF at once and raises, naming the worker and how it ended. Workers end with the
consumer's `close()`, its garbage collection, the interpreter's exit, or (killed
consumer) their own check that their parent is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import weakref
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait

from ingest.stream import _transport

__all__ = ["WorkerError", "Workers"]

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 600.0  # TensorFlow's import and the graph's build, on a loaded machine
_STOP_TIMEOUT_S = 5.0


class WorkerError(RuntimeError):
    """A worker process failed or died; the message names it and the cause."""


def _package_root() -> str:
    import ingest

    return os.path.dirname(os.path.dirname(os.path.abspath(ingest.__file__)))


def core_slices(cores: list, workers: int) -> list:
    """Disjoint slices of `cores`, one a worker (all of them for each when fewer cores than workers)."""
    if workers <= 1 or len(cores) < workers:
        return [list(cores)] * workers
    return [cores[k * len(cores) // workers : (k + 1) * len(cores) // workers] for k in range(workers)]


class Workers:
    """K worker processes, each serving windows k, k + K, ... of one seekable order."""

    def __init__(self, spec: dict, workers: int, *, slots: int = 2, pin: bool = True):
        self.count = workers
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        pinned = core_slices(cores, workers) if pin and cores else [None] * workers
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
        self.procs, self.conns = [], []
        for k in range(workers):
            mine, theirs = socket.socketpair()
            # Blocking whatever socket.setdefaulttimeout says (Beam's GCP auth sets 60 s): a
            # timeout makes the descriptor non-blocking, and a worker's read of it would
            # raise BlockingIOError whenever no message is there yet.
            mine.setblocking(True)
            theirs.setblocking(True)
            proc = subprocess.Popen(
                [sys.executable, "-m", "ingest.stream._worker", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            conn = Connection(mine.detach())
            conn.send(dict(spec, worker=k, workers=workers, slots=slots, cores=pinned[k]))
            self.procs.append(proc)
            self.conns.append(conn)
        self.buffers = [[None] * slots for _ in range(workers)]
        self._finalizer = weakref.finalize(self, _end, self.procs, self.conns, self.buffers)

    def ready(self) -> list:
        """Each worker's facts once its graph is built (raises if one failed)."""
        facts = []
        for k in range(self.count):
            message = self.receive(k, timeout=_READY_TIMEOUT_S)
            if message[0] != "ready":
                raise WorkerError(f"ingest worker {k} of {self.count}: unexpected {message[0]!r} while starting")
            facts.append(message[1])
        return facts

    def send(self, k: int, message) -> None:
        try:
            self.conns[k].send(message)
        except OSError as e:
            raise self._died(k) from e

    def receive(self, k: int, timeout: float | None = None, raise_errors_of: int = -1):
        """Worker k's next message; raises WorkerError for its death, and for its errors while
        starting or in pass `raise_errors_of` (an error of a pass given up is passed over)."""
        conn = self.conns[k]
        try:
            if not wait([conn], timeout):
                raise WorkerError(
                    f"ingest worker {k} of {self.count} (pid {self.procs[k].pid}) sent nothing for {timeout:.0f} s"
                )
            message = conn.recv()
        except (EOFError, OSError) as e:
            raise self._died(k) from e
        if message[0] == "error" and message[1] in (-1, raise_errors_of):
            if message[1] == -1 and message[4] != "WorkerError":  # the request itself: raised as the trainer's own
                raise {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError}[message[4]](message[2])
            raise WorkerError(f"ingest worker {k} of {self.count} failed: {message[2]}\n\nIn the worker:\n{message[3]}")
        if message[0] == "window" and message[5] is not None:  # the slot grew: its new buffer follows
            fd = reduction.recv_handle(conn)
            old = self.buffers[k][message[2]]
            if old is not None:
                old.close()
            self.buffers[k][message[2]] = _transport.Buffer(message[5], fd)
        return message

    def _died(self, k: int) -> WorkerError:
        proc = self.procs[k]
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            hint = " (SIGKILL: often the out-of-memory killer; see dmesg)" if code == -signal.SIGKILL else ""
        else:
            how, hint = f"exited with code {code}", ""
        return WorkerError(
            f"ingest worker {k} of {self.count} (pid {proc.pid}) {how}{hint}: the stream cannot go on. "
            "Make a new loader (or dataset) to restart its workers; resume from your last state_dict."
        )

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive


def _end(procs: list, conns: list, buffers: list) -> None:
    for conn in conns:
        try:
            conn.send(("stop",))
        except OSError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for conn in conns:
        conn.close()
    for row in buffers:
        for buffer in row:
            if buffer is not None:
                buffer.close()
