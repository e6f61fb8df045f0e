"""Test scripts run as processes forked from one that imported TensorFlow once.

    test (pytest worker)                     python -m tests._preloaded FD  (one a pytest worker)
    --------------------                     imports TensorFlow, Keras and make_dataset's
    preloaded.run([script, *args],           modules; runs no op
                  env=..., timeout=...)
        --(script, args, env, cwd, out, err)-->  fork: the child takes env, cwd, argv,
                                                 stdout and stderr, runs the script as
                                                 __main__ and exits with its code
        <--("started", pid)----------------
        <--("exited", code)----------------  code as Popen's returncode (-9: SIGKILL)
    CompletedProcess(args, code, stdout, stderr)

The kill-and-resume tests run each script three times (whole, killed, resumed), each a
new Python that spent ~6 s of CPU importing TensorFlow and Keras before its first line of
work, on a machine whose other core runs the other pytest worker. A fork after the import
is what the script would have been after its imports: the server runs no TensorFlow op
(it refuses to fork when TensorFlow's runtime threads exist, as `ingest.stream._template`
does), so each child starts its own runtime, as a fresh process would. What the child
inherits beyond that is the imported modules' state: a script that must set an
environment variable before TensorFlow is imported (TF_CPP_*, CUDA_VISIBLE_DEVICES)
still needs a real `subprocess.run`.

The server ends when its socket closes: the pytest worker's session ends or the worker
dies (a child running then is killed first). A child outliving its timeout is killed
(SIGKILL) and reaped before the error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _preload() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: F401
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401

    import ingest
    from ingest.pipeline import _dataset  # noqa: F401
    from ingest.stream._template import _runtime_threads

    ingest.make_dataset  # noqa: B018  (the face's lazy name, resolved once here)
    try:
        import torch  # noqa: F401  (a test extra: the PyTorch scripts' ~2 s import)
    except ImportError:
        pass
    started = _runtime_threads()
    if started:
        raise RuntimeError(f"the preloaded imports started TensorFlow's runtime (threads {', '.join(started)})")


def _child(script: str, args: list, env: dict, cwd: str, out: str, err: str) -> None:
    """In the forked child: become `python script *args` and never return."""
    code = 1
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script` sets it
        import runpy

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            _shut_down()
        finally:
            os._exit(code)


def _shut_down() -> None:
    """What the interpreter does at a normal exit, before the child's `os._exit`: wait for
    non-daemon threads, run atexit handlers, flush."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()


def _serve(fd: int) -> None:
    conn = Connection(fd)
    _preload()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(**request)
        conn.send(("started", pid))
        code = _wait(pid, conn)
        if code is None:
            return
        conn.send(("exited", code))


def _wait(pid: int, conn: Connection) -> int | None:
    """The child's exit code; None, the child killed and reaped, when the test side went
    (its socket readable while it waits: nothing is sent during a run but EOF)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if conn.poll(0.1):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None


class Server:
    """One preloaded process; `run` is `subprocess.run(..., capture_output=True, text=True)`."""

    def __init__(self):
        mine, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL="2")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests._preloaded", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=_REPO,
            env=env,
        )
        theirs.close()
        self._conn = Connection(mine.detach())
        self._lock = threading.Lock()

    def run(self, argv: list, *, env: dict | None = None, cwd: str | None = None, timeout: float = 300):
        script, *args = [str(a) for a in argv]
        with self._lock, tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            env = dict(os.environ if env is None else env)
            self._conn.send(dict(script=script, args=args, env=env, cwd=cwd or os.getcwd(), out=out, err=err))
            kind, pid = self._reply(timeout=600)  # the first call waits for the imports
            assert kind == "started", kind
            if not self._conn.poll(timeout):
                os.kill(pid, 9)
                self._reply(timeout=60)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err))
            kind, code = self._reply(timeout=0)
            assert kind == "exited", kind
            return subprocess.CompletedProcess(argv, code, _read(out), _read(err))

    def _reply(self, *, timeout: float):
        if not self._conn.poll(timeout):
            raise RuntimeError(f"the preloaded test process gave no answer in {timeout} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the preloaded test process ended (exit code {self._process.wait()})") from None

    def close(self) -> None:
        self._conn.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
