"""A pytest plugin: the tests listed in tests/slow_tests.txt are marked `slow` at collection.

    tests/slow_tests.txt (node ids, measured by scripts/tier_tests.py)
        -> pytest_collection_modifyitems (first) -> item.add_marker("slow")
        -> `-m "not slow"` (make test-fast) deselects them; `make test` runs them all

A test slow by design (a fresh process, a kill, a benchmark's run) says so in its file with
@pytest.mark.slow; a test that is merely costly by measurement is listed instead, so that
re-tiering as costs change is one regenerated file, not edits across the suite.
"""

from __future__ import annotations

import os

import pytest

LIST = os.path.join(os.path.dirname(__file__), "slow_tests.txt")


def listed() -> frozenset:
    with open(LIST) as f:
        return frozenset(line.strip() for line in f if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)  # before the `-m` expression deselects by markers
def pytest_collection_modifyitems(config, items):
    slow = listed()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
