"""The slow tier by measurement (tests/_tiers.py, scripts/tier_tests.py), on a real pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "scripts"))
import tier_tests  # noqa: E402


def _collected(directory, marks: str) -> list:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-m", marks],
        cwd=directory,
        env=dict(os.environ, PYTHONPATH=_ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return sorted(line for line in run.stdout.splitlines() if "::" in line)


def test_listed_tests_are_marked_slow_and_left_out_of_the_fast_tier(tmp_path):
    (tmp_path / "test_a.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_listed(): pass
            def test_free(): pass

            @pytest.mark.parametrize("i", [1, 2])
            def test_param(i): pass
            """
        )
    )
    (tmp_path / "slow.txt").write_text("# comment\ntest_a.py::test_listed\n\ntest_a.py::test_param[2]\n")
    (tmp_path / "conftest.py").write_text(
        f"import tests._tiers as tiers\ntiers.LIST = {str(tmp_path / 'slow.txt')!r}\n"
        "from tests._tiers import pytest_collection_modifyitems\n"
    )
    assert _collected(tmp_path, "not slow") == ["test_a.py::test_free", "test_a.py::test_param[1]"]
    assert _collected(tmp_path, "slow") == ["test_a.py::test_listed", "test_a.py::test_param[2]"]


def test_a_tests_cost_is_its_phases_summed_from_the_durations_report():
    report = [
        "============================= slowest durations =============================",
        "1.20s call     tests/test_x.py::test_one[a-1]",
        "0.40s setup    tests/test_x.py::test_one[a-1]",
        "0.01s teardown tests/test_x.py::test_two",
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert tier_tests.costs(report) == {"tests/test_x.py::test_one[a-1]": 1.6, "tests/test_x.py::test_two": 0.01}
