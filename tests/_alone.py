"""A pytest plugin: a test marked `alone` runs while no other test of the run does.

Such tests time sub-millisecond intervals. The other core may be busy (a spin loop), but
not with the other xdist worker's TensorFlow threads, which burst over both cores: the
0.14 ms steps of test_idle's fastest producer read 0.10-0.39 idle for 0 on five tries
running beside them. It is a reader-writer lock over the run's workers, two files:

    every test:     turnstile (exclusive, briefly) -> room (shared)    ... test ... release
    `alone` test:   turnstile (exclusive, held)    -> room (exclusive) ... test ... release

The turnstile keeps a waiting `alone` test from being starved by the tests the other worker
keeps starting. The lock spans a test's whole protocol, module fixtures' setup and teardown
included. Without xdist nothing runs beside a test, and nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "alone: times sub-millisecond intervals; the other xdist worker starts no test while it runs"
    )


def _locks(config):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    base = os.path.join(tempfile.gettempdir(), f"ingest-tests-{run}")
    return [open(f"{base}.{name}", "a+") for name in ("turnstile", "room")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not hasattr(item.config, "_ingest_locks"):
        item.config._ingest_locks = _locks(item.config)
    if item.config._ingest_locks is None:
        yield
        return
    turnstile, room = item.config._ingest_locks
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(room, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_unconfigure(config):
    # A worker opens both files at its first test and keeps them: once one worker is done,
    # the other has them open already (or has no test left), so removing them is safe.
    for f in getattr(config, "_ingest_locks", None) or ():
        f.close()
        try:
            os.unlink(f.name)
        except FileNotFoundError:
            pass
