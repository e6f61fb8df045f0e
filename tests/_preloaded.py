"""Test scripts run as processes forked from one that imported TensorFlow once.

    test (pytest worker)                     python -m tests._preloaded FD  (one a pytest worker)
    --------------------                     imports TensorFlow, Keras, torch and
    preloaded.run([script, *args], ...)      make_dataset's modules; runs no op
    preloaded.popen(["-m", module, ...])
        --("start", key, argv, env, cwd)       fork: the child takes env, cwd, argv and
          + stdout, stderr fds (SCM_RIGHTS)-->  the fds, runs the script (or module) as
                                                __main__ and exits with its code
        <--("started", key, pid)------------
        <--("exited", key, code)------------  when it ends, reaped by the server; code as
                                              Popen's returncode (-9: SIGKILL)
    run: CompletedProcess(args, code, stdout, stderr); popen: Child, Popen's methods

The kill-and-resume tests run each script three times (whole, killed, resumed), each a
new Python that spent ~6 s of CPU importing TensorFlow and Keras before its first line of
work, on a machine whose other core runs the other pytest worker. A fork after the import
is what the script would have been after its imports: the server runs no TensorFlow op
(it refuses to fork when TensorFlow's runtime threads exist, as `ingest.stream._template`
does), so each child starts its own runtime, as a fresh process would. What the child
inherits beyond that is the imported modules' state: a script that sets an environment
variable TensorFlow reads at import (the TF_GCS_* settings of tests/gcs.py) still needs a
real `subprocess.run`; those read when the runtime starts (CUDA_VISIBLE_DEVICES) work.

Several children may run at once (a tf.data service's dispatcher and workers). The server
ends when its socket closes: the pytest worker's session ends or the worker dies (its
running children are killed first). A child outliving `run`'s timeout is killed (SIGKILL)
and reaped before the error.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import reduction
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


def _child(argv: list, env: dict, cwd: str, fds: tuple) -> None:
    """In the forked child: become `python ARGV` (a script, `-m module` or `-c code`) and never return.
    `fds`: the child's stdout and stderr, received from the test side."""
    code = 1
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for target, fd in zip(fds, (1, 2)):
            os.dup2(target, fd)
        for target in set(fds):
            os.close(target)
        import runpy

        try:
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                sys.path[0] = ""  # as `python -c` sets it
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            elif argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                sys.path[0] = cwd  # as `python -m` sets it
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python script` sets it
                runpy.run_path(argv[0], run_name="__main__")
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
    """("start", key, argv, env, cwd) and two fds (SCM_RIGHTS) -> fork; ("started", key, pid),
    then ("exited", key, code) when it ends. EOF: every running child killed, then exit."""
    conn = Connection(fd)
    _preload()
    running = {}  # pid -> key
    while True:
        for pid, key in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del running[pid]
                conn.send(("exited", key, os.waitstatus_to_exitcode(status)))
        if not conn.poll(0.05):
            continue
        try:
            _, key, argv, env, cwd = conn.recv()
            fds = (reduction.recv_handle(conn), reduction.recv_handle(conn))
        except (EOFError, OSError):
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(argv, env, cwd, fds)
        for target in fds:
            os.close(target)
        running[pid] = key
        conn.send(("started", key, pid))


class Child:
    """A forked child, as much of `subprocess.Popen` as the tests use: pid, returncode, poll,
    wait, send_signal, terminate, kill, communicate, and stdout when asked for (text)."""

    def __init__(self, server: Server, key: int, args, stdout, stderr_path: str | None):
        self._server, self._key, self.args = server, key, args
        self.stdout = stdout
        self._stderr_path = stderr_path
        self.pid = self._server._answer(key, "started")
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server._exited(self._key, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            self.returncode = self._server._exited(self._key, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.poll() is None:  # a pid the server reaped may name another process by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None):
        out = self.stdout.read() if self.stdout is not None else None
        self.wait(timeout)
        return out, _read(self._stderr_path) if self._stderr_path else None


class Server:
    """One preloaded process. `run` is `subprocess.run(..., capture_output=True, text=True)`;
    `popen` is `subprocess.Popen(..., text=True)` with stdout a pipe or a file."""

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
        self._keys = itertools.count()
        self._answers = {}  # (kind, key) -> pid or exit code

    def run(self, argv: list, *, env: dict | None = None, cwd: str | None = None, timeout: float = 300):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            child = self.popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)
            try:
                code = child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(60)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            return subprocess.CompletedProcess(argv, code, _read(out), _read(err))

    def popen(self, argv: list, *, env=None, cwd=None, stdout=None, stderr=None, merge_stderr=False) -> Child:
        """`stdout`: a path, or None for a pipe (`Child.stdout`, text); `stderr`: a path or
        None for /dev/null; `merge_stderr`: stderr into stdout (subprocess.STDOUT)."""
        argv = [str(a) for a in argv]
        pipe = None
        if stdout is None:
            read_end, out_fd = os.pipe()
            pipe = os.fdopen(read_end, "r")
        else:
            out_fd = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err_fd = out_fd if merge_stderr else os.open(stderr or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        key = next(self._keys)
        env = dict(os.environ if env is None else env)
        with self._lock:
            self._conn.send(("start", key, argv, env, cwd or os.getcwd()))
            for fd in (out_fd, err_fd):
                reduction.send_handle(self._conn, fd, self._process.pid)
        for fd in {out_fd, err_fd}:
            os.close(fd)
        return Child(self, key, argv, pipe, None if merge_stderr else stderr)

    def _answer(self, key: int, kind: str, timeout: float | None = 600):
        """The server's answer `kind` about child `key`; None when none came within `timeout`
        (the first start waits for the server's imports)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if (kind, key) in self._answers:
                    return self._answers.pop((kind, key))
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self._conn.poll(min(left, 0.1) if left is not None else 0.1):
                    try:
                        got, k, value = self._conn.recv()
                    except EOFError:
                        raise RuntimeError(
                            f"the preloaded test process ended (exit code {self._process.wait()})"
                        ) from None
                    self._answers[(got, k)] = value
                    continue
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _exited(self, key: int, *, timeout: float | None):
        return self._answer(key, "exited", timeout)

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
