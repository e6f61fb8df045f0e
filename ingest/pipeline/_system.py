"""Facts about the machine that sizing decisions read (memory budgets for caching and diagnosis, cores)."""

from __future__ import annotations

import os

__all__ = ["physical_memory", "usable_cpus"]

# Where the OS does not say (no sysconf names, e.g. Windows): a small laptop's RAM, so the
# budgets derived from it stay conservative.
_FALLBACK_BYTES = 8 << 30


def physical_memory() -> int:
    """Bytes of physical memory on this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_BYTES


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, as `taskset` sets it): what tf.data counts as cores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1
