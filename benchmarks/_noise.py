"""How far a benchmark's comparison can be trusted: its spread over repeats, and whether
other work shared the machine while it ran.

A verdict compares repeated measurements: "WORSE" only when every run of ours is worse
than every run of the best other pipeline by more than the noise floor (the ranges do not
overlap), "ok" when our median is within the floor of theirs, else "within noise". The
machine's load is read from /proc: CPU time that processes other than this one (and its
children) took during the run, and the load average when it began.
"""

from __future__ import annotations

import dataclasses
import os
import statistics

__all__ = ["Spread", "Machine", "busy_warning", "compare", "spread"]

# Half a percentage point of idle: the spread of one pipeline's idle over repeats of the
# formats scenario on a quiet 2-core machine (the verdict's old fixed margin).
IDLE_FLOOR = 0.005
# Other processes' share of the machine's CPU time above which a run is called busy: a
# tenth of two cores is one core busy a fifth of the time, enough to move sub-ms steps.
BUSY_SHARE = 0.10
# A 1-minute load average per core above which the machine was busy when the run began.
BUSY_LOAD = 0.5


@dataclasses.dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    runs: int

    def __str__(self) -> str:
        if self.runs == 1:
            return f"{100 * self.median:.2f}% (1 run: no spread)"
        return f"{100 * self.median:.2f}% ({100 * self.low:.2f}-{100 * self.high:.2f}, {self.runs} runs)"


def spread(values) -> Spread:
    values = [float(v) for v in values]
    if not values:
        raise ValueError("spread of no measurements: repeat each comparison at least once")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def compare(ours, best, *, floor: float = IDLE_FLOOR) -> str:
    """ "ok", "within noise" or "WORSE" for idle fractions (lower is better) of repeated runs."""
    a, b = spread(ours), spread(best)
    if a.median <= b.median + floor:
        return "ok"
    if a.low > b.high + floor:
        return "WORSE"
    return "within noise"


@dataclasses.dataclass(frozen=True)
class Machine:
    """A reading of the machine: CPU seconds of every process (from /proc/stat) and of this
    one and its children, the 1-minute load average, the time, the cores."""

    all_cpu_s: float
    own_cpu_s: float
    load1: float
    wall_s: float
    cores: int

    @classmethod
    def read(cls) -> "Machine":
        import time

        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        ticks = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal: all but idle and iowait are work.
        busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4)) / ticks
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return cls(busy, own, os.getloadavg()[0], time.monotonic(), os.cpu_count() or 1)


def busy_warning(before: Machine, after: Machine) -> str | None:
    """A warning when other processes took more than BUSY_SHARE of the machine's CPU time
    during the run, or the load average per core exceeded BUSY_LOAD when it began."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return None
    others = max(0.0, (after.all_cpu_s - before.all_cpu_s) - (after.own_cpu_s - before.own_cpu_s))
    share = others / (wall * before.cores)
    load = before.load1 / before.cores
    if share <= BUSY_SHARE and load <= BUSY_LOAD:
        return None
    return (
        f"warning: the machine was busy: other processes took {others:.1f} CPU s of {wall:.1f} s on "
        f"{before.cores} cores ({100 * share:.0f}% of the machine; a quiet run stays under "
        f"{100 * BUSY_SHARE:.0f}%), load average {before.load1:.2f} at the start: verdicts may be noise, "
        "rerun on a quiet machine"
    )
