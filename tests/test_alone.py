"""The `alone` marker's lock (tests/_alone.py), on a real two-worker pytest-xdist run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_TESTS = textwrap.dedent(
    """
    import os, time
    import pytest

    def _spell(name, seconds):
        start = time.monotonic()
        time.sleep(seconds)
        with open(os.environ["SPELLS"], "a") as f:
            f.write(f"{name} {start} {time.monotonic()}\\n")

    @pytest.mark.parametrize("i", range(12))
    def test_shared(i):
        _spell(f"shared{i}", 0.05)

    @pytest.mark.alone
    @pytest.mark.parametrize("i", range(3))
    def test_alone(i):
        _spell(f"alone{i}", 0.3)
    """
)


@pytest.mark.slow  # a pytest run of its own, two workers: 7 s
def test_no_test_runs_while_an_alone_test_does(tmp_path):
    (tmp_path / "test_spells.py").write_text(_TESTS)
    spells = tmp_path / "spells.txt"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SPELLS=str(spells), PYTHONPATH=root, TMPDIR=str(tmp_path))  # the lock files
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests._alone", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "worksteal", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in spells.read_text().splitlines()]
    spans = {name: (float(a), float(b)) for name, a, b in rows}
    assert len(spans) == 15
    shared = [s for name, s in spans.items() if name.startswith("shared")]
    for name, (a, b) in spans.items():
        if name.startswith("alone"):
            others = [s for other, s in spans.items() if other != name]
            assert all(end <= a or start >= b for start, end in others), (name, sorted(spans.items()))
    # Shared tests did run side by side (the lock does not serialize everything).
    assert any(a2 < b1 and a1 < b2 for i, (a1, b1) in enumerate(shared) for a2, b2 in shared[i + 1 :])
    assert not list(tmp_path.glob("ingest-tests-*"))  # removed at the end
