"""tests/_preloaded.py: scripts forked from a process that imported TensorFlow, as `subprocess.run` runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # the server's imports: ~6 s of CPU, paid once a pytest worker

_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import tensorflow as tf

    how = sys.argv[1]
    late = threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True)))
    late.start()  # a non-daemon thread: a normal exit waits for it
    print(os.getpid(), os.getcwd(), os.environ.get("MARK"), sys.path[0], int(tf.reduce_sum([1, 2])))
    print("to stderr", file=sys.stderr)
    if how == "exit":
        sys.exit(7)
    if how == "raise":
        raise ValueError("the script's own error")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        time.sleep(600)
    """
)


def test_a_script_runs_in_a_process_of_its_own_with_its_arguments_env_and_directory(preloaded, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, MARK="m1")
    done = preloaded.run([script, "ok"], env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    first, thread = done.stdout.splitlines()
    pid, cwd, mark, path0, total = first.split()
    assert int(pid) != os.getpid() and (cwd, mark, path0, total) == (str(tmp_path), "m1", str(tmp_path), "3")
    assert thread == "thread done" and "to stderr" in done.stderr
    again = preloaded.run([script, "ok"], env=dict(env, MARK="m2"), cwd=str(tmp_path))
    assert again.stdout.split()[2] == "m2" and again.stdout.split()[0] != pid  # nothing kept from the last run


@pytest.mark.parametrize(
    "how, code, said",
    [("exit", 7, "to stderr"), ("raise", 1, "ValueError: the script's own error"), ("kill", -signal.SIGKILL, "")],
)
def test_exit_codes_are_popens(preloaded, tmp_path, how, code, said):
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    done = preloaded.run([script, how], cwd=str(tmp_path))
    assert done.returncode == code and said in done.stderr


def test_a_script_past_its_timeout_is_killed_and_the_server_serves_on(preloaded, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded.run([script, "hang"], cwd=str(tmp_path), timeout=3)
    assert preloaded.run([script, "exit"], cwd=str(tmp_path)).returncode == 7


def test_the_server_ends_with_its_socket_and_leaves_no_process(tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests._preloaded import Server

    server = Server()
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    assert server.run([script, "exit"], cwd=str(tmp_path)).returncode == 7
    process = server._process
    server.close()
    assert process.poll() is not None


def test_children_run_at_once_each_with_its_pipe_and_signals(preloaded, tmp_path):
    script = tmp_path / "serve.py"
    script.write_text("import sys, time\nprint('serving', sys.argv[1], flush=True)\ntime.sleep(600)\n")
    children = [preloaded.popen([script, str(i)], cwd=str(tmp_path)) for i in range(2)]
    assert [c.stdout.readline().split() for c in children] == [["serving", "0"], ["serving", "1"]]
    assert [c.poll() for c in children] == [None, None] and children[0].pid != children[1].pid
    children[1].terminate()
    assert children[1].wait(timeout=30) == -signal.SIGTERM and children[0].poll() is None
    children[0].kill()
    assert children[0].wait(timeout=30) == -signal.SIGKILL
    children[0].kill()  # gone: nothing is signalled
    modules = preloaded.popen(["-m", "json.tool", "--help"], merge_stderr=True)
    out, _ = modules.communicate(timeout=60)
    assert modules.returncode == 0 and "usage:" in out
