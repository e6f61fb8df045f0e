"""ingest.loader and its worker processes: the same batches as make_dataset for any number of
workers, resume by position, ranks, torch and jax outputs, failures and clean-up."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

import ingest
from tests.conftest import convert_table

ROWS = 3000
BATCH = 100
# Windows of 4 blocks of 64 rows (256 rows, rounded up to 300: whole batches): the 3,000
# rows make 10 windows an epoch, so every worker gets several.
OPTIONS = ingest.ReadOptions(block_window=4)
KW = dict(batch_size=BATCH, seed=7, num_epochs=2, options=OPTIONS)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "x": rng.normal(size=ROWS).astype(np.float32),
            "word": [f"w{i % 11}" for i in range(ROWS)],
            "y": rng.integers(0, 3, ROWS),
        }
    )
    root = tmp_path_factory.mktemp("loader")
    return convert_table(root, table, "--num_shards", "3", "--block_rows", "64", "--label", "y")


def _digest(batches) -> list:
    out = []
    for features, label in batches:
        h = hashlib.sha1()
        for name in sorted(features):
            v = np.asarray(features[name])
            h.update(b"|".join(v.ravel()) if v.dtype == object else np.ascontiguousarray(v).tobytes())
        h.update(np.asarray(label).tobytes())
        out.append(h.hexdigest())
    return out


def _reference(dataset, passes=1, **kw):
    ds = ingest.make_dataset(dataset, **{**KW, **kw})
    return [_digest(ds.as_numpy_iterator()) for _ in range(passes)]


def test_the_loader_delivers_make_datasets_batches_pass_after_pass(dataset):
    want = _reference(dataset, passes=2)
    for processes in (0,):
        with ingest.loader(dataset, processes=processes, **KW) as loader:
            got = [_digest(loader), _digest(loader)]  # two passes: two orders, as two iterators
        assert got == want, processes
    assert want[0] != want[1]


@pytest.mark.slow
def test_one_and_three_workers_deliver_the_same_batches(dataset):
    want = _reference(dataset, passes=2)
    for processes in (1, 3):  # 2: test_state_dict_resumes_at_the_exact_next_batch
        with ingest.loader(dataset, processes=processes, **KW) as loader:
            assert [_digest(loader), _digest(loader)] == want, processes


@pytest.mark.slow
def test_workers_serve_after_a_library_set_a_default_socket_timeout(dataset):
    # Beam's GCP auth sets socket.setdefaulttimeout(60) in the process (a conversion to
    # gs:// before the loader, in a notebook or a test session): the workers' sockets made
    # after it must still block, or a worker's read finds no message and raises EAGAIN.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(60)
    try:
        with ingest.loader(dataset, processes=1, **dict(KW, num_epochs=1)) as loader:
            ids = np.concatenate([f["id"] for f, _ in loader])
    finally:
        socket.setdefaulttimeout(previous)
    assert sorted(ids) == list(range(ROWS))


@pytest.mark.slow
def test_every_row_comes_once_per_epoch_as_writable_arrays(dataset):
    with ingest.loader(dataset, processes=2, **KW) as loader:
        batches = list(loader)
        assert len(batches) == len(loader) == 2 * ROWS // BATCH
    ids = np.concatenate([f["id"] for f, _ in batches])
    for epoch in ids.reshape(2, ROWS):
        assert sorted(epoch) == list(range(ROWS))
    features, label = batches[0]
    assert features["x"].flags.writeable and label.flags.writeable
    assert features["x"].dtype == np.float32 and features["word"].dtype == object


def test_a_short_last_batch_comes_unless_dropped(dataset):
    # The consumer cuts the batches from the windows, wherever they were made.
    kw = dict(KW, batch_size=128, num_epochs=1)
    with ingest.loader(dataset, processes=0, **kw) as loader:
        sizes = [len(y) for _, y in loader]
    assert sizes == [128] * (ROWS // 128) + [ROWS % 128]
    assert _digest(ingest.loader(dataset, processes=0, **kw)) == _reference(dataset, **kw)[0]
    with ingest.loader(dataset, processes=0, drop_remainder=True, **kw) as loader:
        assert [len(y) for _, y in loader] == [128] * (ROWS // 128)


@pytest.mark.slow
def test_state_dict_resumes_at_the_exact_next_batch(dataset):
    whole = _reference(dataset, passes=2)
    with ingest.loader(dataset, processes=2, **KW) as first:
        list(first)  # pass 0
        it = iter(first)
        head = [next(it) for _ in range(13)]
        state = first.state_dict()
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 400
    assert (state["pass"], state["batch"]) == (1, 13)
    with ingest.loader(dataset, processes=2, **KW) as second:
        second.load_state_dict(state)
        rest = _digest(second)
        assert _digest(head) + rest == whole[1]
        assert second.state_dict()["pass"] == 2 and second.state_dict()["batch"] == 0


def test_a_state_of_another_stream_is_refused_naming_the_difference(dataset):
    with ingest.loader(dataset, processes=0, **KW) as loader:
        state = loader.state_dict()
    with ingest.loader(dataset, processes=0, **dict(KW, batch_size=50)) as other:
        with pytest.raises(ValueError, match=r"batch_size: the state has 100, this loader 50"):
            other.load_state_dict(state)
    with ingest.loader(dataset, processes=0, **dict(KW, seed=8)) as other:
        with pytest.raises(ValueError, match=r"seed: the state has 7, this loader 8"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"not an ingest.loader state"):
        loader.load_state_dict({"pass": 1})


def test_ranks_read_disjoint_parts_of_equal_batch_counts(dataset):
    kw = dict(KW, num_epochs=1)
    parts, counts = [], []
    for rank in range(2):
        with ingest.loader(dataset, processes=0, rank=rank, world_size=2, **kw) as loader:
            batches = [f["id"] for f, _ in loader]
            assert len(batches) == len(loader)
        counts.append(len(batches))
        parts.append(np.concatenate(batches))
    assert counts[0] == counts[1]  # a DDP step on every rank, or none
    assert not set(parts[0]) & set(parts[1])
    # What the larger part leaves out: less than a batch plus a block (parts differ by < a block).
    assert 0 <= ROWS - len(parts[0]) - len(parts[1]) < BATCH + 64


def test_rank_blocks_cut_consecutive_blocks_at_equal_shares():
    from ingest.stream._plan import rank_blocks

    assert rank_blocks([64] * 47, 2) == [(0, 23), (23, 47)]
    parts = rank_blocks([64] * 46 + [56], 3)
    assert parts[0][0] == 0 and parts[-1][1] == 47 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    sizes = [b - a for a, b in parts]
    assert max(sizes) - min(sizes) <= 1
    assert rank_blocks([10, 10], 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]  # more ranks than blocks: some read none


@pytest.mark.parametrize("to", ["numpy", "torch"])
@pytest.mark.parametrize("batch", [1, 100, 1024, 1025, 5000])
def test_batches_cut_in_groups_hold_their_rows_in_memory_of_their_own(to, batch):
    # Small batches are one copy a column a group of ~16k rows, cut into views; larger
    # ones a copy each. Either way each batch holds exactly its rows, starting wherever the
    # pass starts in the window and ending with a short batch, and writing into it
    # leaves the window (a worker's shared memory) alone.
    if to == "torch":
        pytest.importorskip("torch")
    from ingest.stream import _loader, _transport

    rows = 40_000
    rng = np.random.default_rng(1)
    window = [rng.random(rows, dtype=np.float32), rng.integers(0, 9, (rows, 2))]
    text = _transport._Text(np.arange(rows + 1), memoryview(bytes(range(256)) * 157), (rows,))
    columns = window + ([text] if to == "numpy" else [])
    before = [c.copy() for c in window]
    for column in window:
        column.flags.writeable = False  # as a slot's views are
    ranges = [(first, min(first + batch, rows)) for first in range(3 * batch, rows, batch)]
    groups = list(_loader._converter(to, None)(columns, ranges))
    assert max(len(g) for g in groups) == (16384 // batch if batch <= 1024 else 1)
    got = [b for g in groups for b in g]
    assert len(got) == len(ranges)
    for (first, end), arrays in zip(ranges, got):
        for column, array in zip(columns, arrays):
            want = column.rows(first, end) if column is text else column[first:end]
            np.testing.assert_array_equal(np.asarray(array), want)
        np.asarray(arrays[0])[:] = -1
    for column, kept in zip(window, before):
        np.testing.assert_array_equal(column, kept)


def test_torch_and_jax_batches_hold_the_numpy_values(dataset):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    kw = dict(KW, num_epochs=1, features=["id", "x"])
    with ingest.loader(dataset, processes=0, **kw) as loader:
        want = list(loader)
    with ingest.loader(dataset, processes=0, to="torch", **kw) as loader:
        got = list(loader)
    assert isinstance(got[0][0]["x"], torch.Tensor) and got[0][0]["x"].dtype == torch.float32
    for (f, y), (tf_, ty) in zip(want, got):
        np.testing.assert_array_equal(f["x"], tf_["x"].numpy())
        np.testing.assert_array_equal(y, ty.numpy())
    with ingest.loader(dataset, processes=0, to="jax", device=jax.devices("cpu")[0], **kw) as loader:
        got = list(loader)
    assert isinstance(got[0][0]["id"], jax.Array)
    np.testing.assert_array_equal(np.asarray(got[-1][1]), want[-1][1])
    with pytest.raises(ValueError, match=r"text='ids'"):
        list(ingest.loader(dataset, processes=0, to="torch", **dict(KW, num_epochs=1)))


def test_under_torchs_data_loader(dataset):
    torch = pytest.importorskip("torch")
    kw = dict(KW, num_epochs=1, features=["id"])
    with ingest.loader(dataset, processes=0, to="torch", **kw) as loader:
        assert isinstance(loader, torch.utils.data.IterableDataset)
        got = [f["id"] for f, _ in torch.utils.data.DataLoader(loader, batch_size=None)]
    with ingest.loader(dataset, processes=0, **kw) as loader:
        want = [f["id"] for f, _ in loader]
    assert [t.numpy().tolist() for t in got] == [w.tolist() for w in want]


def test_arguments_are_checked_before_any_worker_starts(dataset):
    with pytest.raises(ValueError, match=r"to must be one of"):
        ingest.loader(dataset, batch_size=8, to="tensorflow")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        ingest.loader(dataset, batch_size=8, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"processes must be an int >= 0"):
        ingest.loader(dataset, batch_size=8, processes=-1)


@pytest.mark.slow
def test_a_workers_build_error_is_raised_in_the_trainer(dataset, tmp_path):
    with pytest.raises(ValueError, match=r"features \['nope'\] do not exist"):
        with ingest.loader(dataset, processes=1, batch_size=8, features=["nope"]) as loader:
            next(iter(loader))


def _child(dataset, body: str) -> subprocess.Popen:
    code = textwrap.dedent(
        f"""
        import sys, ingest
        loader = ingest.loader({dataset!r}, processes=2, batch_size={BATCH}, seed=1, num_epochs=None,
                               options=ingest.ReadOptions(block_window=4))
        it = iter(loader)
        next(it)
        print(" ".join(str(p.pid) for p in loader._stream.workers.procs), flush=True)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", code + textwrap.dedent(body)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )


def _gone(pids, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in pids):
            return True
        time.sleep(0.2)
    return False


def _state(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_no_worker_outlives_a_killed_or_finished_trainer(dataset):
    killed = _child(dataset, "import time; time.sleep(600)")
    pids = [int(p) for p in killed.stdout.readline().split()]
    assert len(pids) == 2 and all(_state(p) not in ("gone", "Z") for p in pids)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert _gone(pids, within=10), "workers outlived a killed trainer"
    finished = _child(dataset, "pass  # exits with the iterator and loader alive")
    pids = [int(p) for p in finished.stdout.readline().split()]
    assert finished.wait(timeout=60) == 0
    assert _gone(pids, within=10), "workers outlived the trainer's exit"


@pytest.mark.slow
def test_a_killed_worker_is_an_error_naming_it_not_a_hang(dataset):
    with ingest.loader(dataset, processes=2, batch_size=BATCH, seed=1, num_epochs=None, options=OPTIONS) as loader:
        it = iter(loader)
        next(it)
        victim = loader._stream.workers.procs[1]
        victim.kill()
        started = time.monotonic()
        with pytest.raises(ingest.WorkerError, match=r"ingest worker 1 of 2 \(pid \d+\) was killed by SIGKILL"):
            for _ in range(10_000):
                next(it)
        assert time.monotonic() - started < 30
    assert _gone([p.pid for p in loader._stream.workers.procs], within=10)


@pytest.mark.slow
def test_workers_are_forked_from_one_template_and_end_with_it(dataset):
    with ingest.loader(dataset, processes=2, batch_size=BATCH, seed=1, num_epochs=None, options=OPTIONS) as loader:
        it = iter(loader)
        next(it)
        workers = loader._stream.workers
        template = workers.template.proc
        assert [_parent(p.pid) for p in workers.procs] == [template.pid] * 2
        template.kill()
        ended = r"ingest worker \d of 2 \(pid \d+\) ended with the worker template"
        with pytest.raises(ingest.WorkerError, match=ended):
            for _ in range(10_000):
                next(it)
    assert _gone([p.pid for p in workers.procs] + [template.pid], within=10)


@pytest.mark.slow
def test_a_processs_loaders_share_one_template_which_ends_when_idle(dataset, monkeypatch):
    """A second loader forks its workers from the first one's template (no TensorFlow import
    again), also while the first is open; not after the environment changed; an idle
    template ends by itself."""
    from ingest.stream import _workers

    kw = dict(processes=2, batch_size=BATCH, seed=1, num_epochs=1, options=OPTIONS, features=["id"])
    with ingest.loader(dataset, **kw) as first:
        want = [f["id"].tolist() for f, _ in first]
        template = first._stream.workers.template.proc
        with ingest.loader(dataset, **kw) as second:  # both open: one template, four workers
            assert [f["id"].tolist() for f, _ in second] == want
            assert second._stream.workers.template.proc is template
            assert [_parent(p.pid) for p in second._stream.workers.procs] == [template.pid] * 2
    # After both closed, within the idle time, in what pytest says is another test (a variable
    # no worker reads): the same template.
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/other.py::test_other (call)")
    with ingest.loader(dataset, **kw) as third:
        assert [f["id"].tolist() for f, _ in third] == want and third._stream.workers.template.proc is template
    # Another environment (workers read the one their template started with): a new template,
    # idle for a second at most, which then ends; the next loader starts another.
    monkeypatch.setattr(_workers, "_IDLE_S", 1.0)
    monkeypatch.setenv("INGEST_TEST_MARK", "1")
    with ingest.loader(dataset, **kw) as other:
        short = other._stream.workers.template.proc
        assert short is not template and [f["id"].tolist() for f, _ in other] == want
        with open(f"/proc/{other._stream.workers.procs[0].pid}/environ", "rb") as f:
            assert b"INGEST_TEST_MARK=1" in f.read().split(b"\0")
    template.kill()  # the one of 30 s, no longer this process's: ended here, not waited for
    template.wait()
    assert short.wait(timeout=30) == 0  # its idle end, after its last worker
    with ingest.loader(dataset, **kw) as last:
        assert [f["id"].tolist() for f, _ in last] == want and last._stream.workers.template.proc is not short


def _parent(pid) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_the_template_refuses_to_fork_once_tensorflows_runtime_runs():
    import tensorflow as tf

    from ingest.stream import _template

    tf.constant(1) + 1  # this process's runtime runs (the template's must not: a fork copies its locks)
    assert _template._runtime_threads()
    with pytest.raises(RuntimeError, match="started TensorFlow's runtime .*make it inside a function"):
        _template._preload()


@pytest.mark.slow
def test_the_trainer_does_not_import_tensorflow_with_worker_processes(dataset):
    code = textwrap.dedent(
        f"""
        import sys, ingest
        with ingest.loader({dataset!r}, processes=1, batch_size=500, seed=1) as loader:
            n = sum(len(y) for _, y in loader)
        print(n, "tensorflow" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=os.getcwd())
    assert out.stdout.split() == [str(ROWS), "False"]


@pytest.mark.slow
def test_a_torch_run_killed_mid_epoch_resumes_to_the_same_weights(dataset, tmp_path, preloaded):
    pytest.importorskip("torch")
    child = [os.path.join(os.path.dirname(__file__), "torch_resume_child.py"), dataset]

    def run(checkpoint, kill_at):  # each run a process of its own, forked before any op (tests/_preloaded.py)
        return preloaded.run(child + [str(checkpoint), str(kill_at)], timeout=300)

    # The uninterrupted run beside the killed one and its resumption: it shares nothing with them.
    whole = preloaded.popen(child + [str(tmp_path / "whole.pt"), "-1"], stderr=str(tmp_path / "whole.err"))
    killed = run(tmp_path / "cut.pt", 37)  # mid-way through the second epoch's pass
    assert killed.returncode == -signal.SIGKILL
    resumed = run(tmp_path / "cut.pt", -1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert whole.wait(timeout=300) == 0, (tmp_path / "whole.err").read_text()[-2000:]
    weights, steps, ran = whole.communicate()[0].split()
    assert resumed.stdout.split() == [weights, steps, str(int(steps) - 37)]


def test_torchdatas_stateful_data_loader_saves_and_resumes_the_position(dataset):
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    kw = dict(KW, num_epochs=1, features=["id"])
    with ingest.loader(dataset, processes=0, **kw) as reference:
        want = [f["id"].tolist() for f, _ in reference]
    with ingest.loader(dataset, processes=0, to="torch", **kw) as loader:
        first = stateful.StatefulDataLoader(loader, batch_size=None)
        it = iter(first)
        head = [next(it)[0]["id"].tolist() for _ in range(4)]
        state = first.state_dict()
    with ingest.loader(dataset, processes=0, to="torch", **kw) as loader:
        second = stateful.StatefulDataLoader(loader, batch_size=None)
        second.load_state_dict(state)
        rest = [f["id"].tolist() for f, _ in second]
    assert head + rest == want


@pytest.mark.slow
def test_a_global_seed_orders_the_loader_as_it_orders_make_dataset(dataset):
    import tensorflow as tf

    tf.random.set_seed(2)
    try:
        want = _reference(dataset)
        before = tf.random.uniform([2]).numpy()
        with ingest.loader(dataset, processes=0, **KW) as loader:
            got = [_digest(loader)]
        after = tf.random.uniform([2]).numpy()
        tf.random.set_seed(2)
        _reference(dataset)
        # The trainer's own random ops go on as if the loader had not run (no set_seed behind its back).
        np.testing.assert_array_equal(tf.random.uniform([2]).numpy(), before)
        np.testing.assert_array_equal(tf.random.uniform([2]).numpy(), after)
    finally:
        tf.random.set_seed(None)
    assert got == want
    assert want != _reference(dataset)  # another global seed, another order (as make_dataset's)


@pytest.mark.parametrize("processes", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_stream_as_a_tf_dataset_gives_make_datasets_batches(dataset, processes):
    """Design (g) of #45 (benchmarks/processes.py, device_probe.py proc): windows cross into
    tf.data one Python call each, batches are cut in the runtime; a short batch included."""
    from ingest.stream import Stream, _tf_feed

    # 2 epochs of 3,000 rows in batches of 128: the pass ends in a short batch of 112
    kw = {**KW, "batch_size": 128, "shuffle": True}
    want = _reference(dataset, passes=2, batch_size=128)
    stream = Stream({"path": dataset, "request": kw}, processes=processes)
    try:
        ds = _tf_feed.batches(stream)
        got = [_digest(ds.as_numpy_iterator()), _digest(ds.as_numpy_iterator())]
        sizes = [len(label) for _, label in ds.as_numpy_iterator()]
    finally:
        stream.close()
    assert got == want
    assert want[0] != want[1] and sizes == [128] * 46 + [112]
