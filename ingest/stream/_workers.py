"""The consumer's side of the worker processes: start them, hear from them, end them.

Workers are forked by one template process (`ingest.stream._template`, a plain `python
-m` process: not multiprocessing's spawn or forkserver, which would import the trainer's
`__main__` again in every worker) that imports TensorFlow once. Each worker holds one end
of a socket pair. A worker that dies closes its end: the consumer's next read of it gets
EOF at once and raises, naming the worker and how it ended (the template reaps it and
says). Workers end with the consumer's `close()`, its garbage collection, the
interpreter's exit, or (killed consumer) the template's end.

One template serves every loader of a process, one after another or at once: a second
loader (an evaluation split, a restart from a state_dict) forks its workers at once
instead of importing TensorFlow again. The template ends `_IDLE_S` after its last worker
did, so a closed loader's memory comes back soon; the next loader then starts a new one.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait

from ingest.stream import _transport

__all__ = ["WorkerError", "Workers"]

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 600.0  # TensorFlow's import and the graph's build, on a loaded machine
_STOP_TIMEOUT_S = 5.0
# How long a template with no worker waits for the next loader before it ends: it holds
# TensorFlow's imported modules (~300 MB here), and a second loader usually comes within
# seconds of the first (train then eval, a restart) or not at all.
_IDLE_S = 30.0
_SHARED: dict = {}  # "template" -> this process's _Template
# Variables a process's host rewrites that no worker reads, left out of the environment a
# template is started with and compared by: pytest sets PYTEST_CURRENT_TEST at each phase of
# each test, so every test's loader started a template of its own (12 in a run of the loader
# tests, each importing TensorFlow again).
_UNREAD = frozenset({"PYTEST_CURRENT_TEST"})
_SHARED_LOCK = threading.Lock()


def _shared_template(*, stale=None) -> "_Template":
    """This process's template, started when there is none, it ended (`stale`: the one that
    just failed), it belongs to the process this one was forked from, or this process's
    environment changed since it started (its workers read theirs from it); a template
    left so ends when idle."""
    with _SHARED_LOCK:
        template = _SHARED.get("template")
        if (
            template is None
            or template is stale
            or template.pid != os.getpid()
            or template.environ != _environment()
            or template.proc.poll() is not None
        ):
            template = _SHARED["template"] = _Template()
        return template


def _environment() -> dict:
    """This process's environment as its workers would read it."""
    return {k: v for k, v in os.environ.items() if k not in _UNREAD}


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
        self.template = _shared_template()
        self.procs, self.conns = [], []
        try:
            for k in range(workers):
                mine, theirs = socket.socketpair()
                # Blocking whatever socket.setdefaulttimeout says (Beam's GCP auth sets 60 s): a
                # timeout makes the descriptor non-blocking, and a worker's read of it would
                # raise BlockingIOError whenever no message is there yet.
                mine.setblocking(True)
                theirs.setblocking(True)
                try:
                    key, pid = self.template.fork(theirs)
                except WorkerError:
                    if k or self.template.proc.poll() != 0:
                        raise
                    # It ended idle as this loader asked (exit code 0): a new one, once.
                    self.template = _shared_template(stale=self.template)
                    key, pid = self.template.fork(theirs)
                theirs.close()
                conn = Connection(mine.detach())
                conn.send(dict(spec, worker=k, workers=workers, slots=slots, cores=pinned[k]))
                self.procs.append(_Forked(self.template, key, k, pid))
                self.conns.append(conn)
        except BaseException:
            _end(self.template, self.procs, self.conns, [])
            raise
        self.buffers = [[None] * slots for _ in range(workers)]
        self._finalizer = weakref.finalize(self, _end, self.template, self.procs, self.conns, self.buffers)

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
        template = self.template.proc
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            hint = " (SIGKILL: often the out-of-memory killer; see dmesg)" if code == -signal.SIGKILL else ""
        elif code is None and template.poll() is not None:  # it ends itself when its parent goes
            how, hint = f"ended with the worker template (pid {template.pid}, exit code {template.returncode})", ""
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


def _end(template, procs: list, conns: list, buffers: list) -> None:
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
            proc.wait(timeout=_STOP_TIMEOUT_S)
    for conn in conns:
        conn.close()
    for row in buffers:
        for buffer in row:
            if buffer is not None:
                buffer.close()
    # The template stays for this process's next loader; it ends _IDLE_S after its last worker.


class _Template:
    """The template process (see `ingest.stream._template`) and what it says of its workers."""

    def __init__(self):
        self.environ = _environment()
        env = dict(self.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
        mine, theirs = socket.socketpair()
        mine.setblocking(True)
        theirs.setblocking(True)
        self.pid = os.getpid()  # the consumer's: a process forked from it needs its own
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.stream._template", str(theirs.fileno()), str(os.getpid()), str(_IDLE_S)],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.exits: dict = {}  # key -> the worker's returncode
        self.pids: dict = {}  # key -> the worker's pid
        self._keys = itertools.count()  # one a worker, over every loader this template serves
        self._lock = threading.Lock()  # loaders, their feeder threads and callers may all ask

    def fork(self, sock: socket.socket) -> tuple:
        """A worker, forked with `sock` as its end of the consumer's socket: (its key, its pid)."""
        with self._lock:
            key = next(self._keys)
            try:
                self.conn.send(("fork", key))
                reduction.send_handle(self.conn, sock.fileno(), self.proc.pid)
            except OSError as e:
                raise self._gone() from e
        self.collect(_READY_TIMEOUT_S, until=lambda: key in self.pids)
        if key not in self.pids:
            raise WorkerError(f"the ingest worker template (pid {self.proc.pid}) forked no worker in time")
        return key, self.pids.pop(key)

    def collect(self, timeout: float | None, until=lambda: False) -> None:
        """Reads what the template says, for up to `timeout` seconds or until `until()`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not until():
                if not wait([self.conn], None if deadline is None else max(0.0, deadline - time.monotonic())):
                    return
                try:
                    message = self.conn.recv()
                except (EOFError, OSError) as e:
                    raise self._gone() from e
                if message[0] == "forked":
                    self.pids[message[1]] = message[2]
                else:  # ("exited", k, returncode)
                    self.exits[message[1]] = message[2]

    def _gone(self) -> "WorkerError":
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        return WorkerError(
            f"the ingest worker template (pid {self.proc.pid}) exited with code {code}: no worker can start. "
            "It imports TensorFlow: run `python -c 'import tensorflow'` to see why that fails."
        )

    def close(self) -> None:
        self.conn.close()
        try:
            self.proc.wait(timeout=_STOP_TIMEOUT_S + 5.0)  # it gives a lingering worker 5 s
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Forked:
    """A worker forked by the template: the part of Popen the consumer uses (pid, wait,
    kill, returncode), its end learnt from the template, which reaps it."""

    def __init__(self, template: _Template, key: int, k: int, pid: int):
        self.template, self.key, self.k, self.pid = template, key, k, pid

    @property
    def returncode(self):
        return self.template.exits.get(self.key)

    def wait(self, timeout: float | None = None) -> int | None:
        """Its returncode; None when the template went first (the worker then ends itself)."""
        try:
            self.template.collect(timeout, until=lambda: self.returncode is not None)
        except WorkerError:  # the template went: its workers went with it, or go now
            pass
        if self.returncode is None:
            if self.template.proc.poll() is not None:
                return None
            raise subprocess.TimeoutExpired(f"ingest worker {self.k}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
