"""Which worker holds which window, and where a stream's batches begin and end: pure functions.

The seekable order numbers its windows 0, 1, 2, ... over the whole stream of epochs; each
window holds a whole number of batches (its rows are a multiple of the batch size), so a
batch never spans two windows and the stream's order is fixed by the windows' order.
Window w goes to worker w % K: any K gives the same windows, in the same order.
"""

from __future__ import annotations

import dataclasses

__all__ = ["StreamPlan"]


@dataclasses.dataclass(frozen=True)
class StreamPlan:
    """One rank's stream: its rows per epoch, cut in windows and batches, dealt to K workers."""

    batch_size: int
    window_rows: int  # rows a window holds: a multiple of batch_size
    epoch_rows: int  # rows of one epoch of this rank
    num_epochs: int | None  # None: endless
    drop_remainder: bool
    workers: int
    # Batches every rank delivers per pass, when ranks must agree on a count (a DDP step
    # waits for every rank): the fewest any rank has. None: this rank's own count.
    batch_limit: int | None = None

    def __post_init__(self):
        if self.batch_size < 1 or self.window_rows % self.batch_size:
            raise ValueError(f"window_rows={self.window_rows} must be a multiple of batch_size={self.batch_size}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    @property
    def batches_per_window(self) -> int:
        return self.window_rows // self.batch_size

    @property
    def stream_rows(self) -> int | None:
        return None if self.num_epochs is None else self.epoch_rows * self.num_epochs

    @property
    def own_batches(self) -> int | None:
        """Batches in this rank's stream, before any limit; None when endless."""
        rows = self.stream_rows
        if rows is None:
            return None
        return rows // self.batch_size if self.drop_remainder else -(-rows // self.batch_size)

    @property
    def batches(self) -> int | None:
        """Batches this rank delivers per pass: its own, or the ranks' common count."""
        own = self.own_batches
        if self.batch_limit is None:
            return own
        return self.batch_limit if own is None else min(own, self.batch_limit)

    def window_of(self, batch: int) -> int:
        return batch // self.batches_per_window

    def worker_of(self, window: int) -> int:
        return window % self.workers

    def batch_rows(self, batch: int) -> int:
        """Rows of batch `batch`: the batch size, or fewer for a stream's short last batch."""
        rows = self.stream_rows
        if rows is None:
            return self.batch_size
        return max(0, min(self.batch_size, rows - batch * self.batch_size))

    def windows_from(self, start: int) -> range:
        """The windows a pass starting at batch `start` reads, in order (endless: up to 2**62)."""
        stop = self.batches
        last = 2**62 if stop is None else -(-stop // self.batches_per_window)
        return range(self.window_of(start), max(self.window_of(start), last))


def rank_blocks(rows, world_size: int) -> list:
    """[blocks] rows a block -> each rank's (first, stop) block range: consecutive blocks
    (runs in their shards stay whole), cut where the rows are nearest an equal share, so
    ranks differ by at most about a block's rows."""
    import numpy as np

    ends = np.cumsum(np.asarray(rows, np.int64))
    total = int(ends[-1]) if len(ends) else 0
    cuts = [0]
    for r in range(1, world_size):
        target = total * r / world_size
        at = int(np.searchsorted(ends, target))  # the block holding the target row
        # End the part after that block or before it, whichever is nearer the share.
        before = int(ends[at - 1]) if at > 0 else 0
        after = int(ends[at]) if at < len(ends) else total
        cuts.append(max(cuts[-1], at + 1 if after - target < target - before else at))
    cuts.append(len(ends))
    return [(cuts[r], cuts[r + 1]) for r in range(world_size)]
