"""The workers' template: one process that imports TensorFlow once and forks each worker.

    consumer --starts--> python -m ingest.stream._template FD PARENT IDLE_S
                         imports TensorFlow and the worker's modules; runs no TF op
             --("fork", k) + worker k's socket end (SCM_RIGHTS)-->
                         fork: the child closes the template's socket and runs
                         `_worker.main` on its own end; the template closes its copy
             <--("forked", k, pid)--
             <--("exited", k, code)-- when worker k ends (the template reaps it;
                         `code` as Popen's returncode: -9 for SIGKILL)
             k: a key over every worker of every loader the process makes, one after
             another or at once; the template ends IDLE_S after its last worker

Importing TensorFlow costs each process ~6 s of CPU here (~3 s on an H100 host's cores),
K times over, and each worker's copy of the imported modules is its own; forked, the
import is paid once, its pages shared until written. A fork is safe here because the
template never starts TensorFlow's runtime (no op, no thread pool): each worker starts
its own after the fork, as a fresh process would. The template ends when its socket
closes (the consumer's death), its parent goes, or it has had no worker for IDLE_S
seconds (the consumer's last loader closed), after its workers.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait

_POLL_S = 0.1  # how often a quiet template reaps its children
_GRACE_S = 5.0


def _preload() -> None:
    """What every worker imports before its first message (TensorFlow above all)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401

    from ingest.pipeline import _dataset, _request  # noqa: F401
    from ingest.pipeline.blocks import seekable  # noqa: F401
    from ingest.stream import _worker  # noqa: F401

    started = _runtime_threads()
    if started:  # a fork would copy locks those threads hold: a worker could hang on one
        raise RuntimeError(
            f"importing the worker's modules started TensorFlow's runtime (threads {', '.join(started)}): "
            "a module makes a tensor at import; make it inside a function"
        )


def _runtime_threads() -> list:
    tasks = "/proc/self/task"
    names = []
    for t in os.listdir(tasks) if os.path.isdir(tasks) else ():
        try:
            with open(f"{tasks}/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted({n for n in names if n.startswith("tf_")})


def _fork(conn: Connection, k: int, fd: int, children: dict) -> None:
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            conn.close()
            from ingest.stream import _worker

            _worker.main(fd, os.getppid())
            code = 0
        finally:
            os._exit(code)  # never back into the template's loop, nor its atexit
    os.close(fd)
    children[pid] = k
    conn.send(("forked", k, pid))


def _reap(conn: Connection, children: dict) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        k = children.pop(pid, None)
        if k is not None:
            try:
                conn.send(("exited", k, os.waitstatus_to_exitcode(status)))
            except OSError:  # the consumer went: its workers go too
                pass


def main(fd: int, parent: int, idle_s: float) -> None:
    conn = Connection(fd)
    children: dict = {}
    try:
        _preload()
        idle_since = time.monotonic()
        while os.getppid() == parent:
            if wait([conn], _POLL_S):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    break
                if message[0] == "fork":
                    _fork(conn, message[1], reduction.recv_handle(conn), children)
            _reap(conn, children)
            if children:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_s:
                break  # no loader needs it: its memory back; the next loader starts another
    finally:
        _end(children)


def _end(children: dict) -> None:
    """The consumer closed (its workers stopped already) or died: a worker still there gets
    `_GRACE_S` to see its socket close, then SIGKILL; none is left a zombie."""
    deadline = time.monotonic() + _GRACE_S
    while children and time.monotonic() < deadline:
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                del children[pid]
        time.sleep(0.05)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
