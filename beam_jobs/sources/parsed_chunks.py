"""Chunks the type-inference pass parsed, kept in the worker's memory for the conversion pass.

CSV types are decided from counts over the whole input, so every CSV work item is read
twice: once to count the types of its cells, once to convert them. When both passes run
in the same process (the in-process DirectRunner, or a Dataflow worker that happens to
take an item in both stages), the second parse is work done again: on the 200k-row
corpora, parsing and cutting records cost 0.16-0.20 s of CPU per pass. The first pass keeps
what it parsed here, up to a memory budget, and the conversion takes it back; an item
that was not kept (another process, over the budget, another job) is parsed again, as
before. The chunks are the parser's output, so the two passes see the same data.
"""

from __future__ import annotations

import threading

__all__ = ["ParsedChunks", "Keeper", "KEPT"]

# The parsed batches of every work item of a job are held together, between the two
# passes, with the numbers the type count parsed (`Chunk.casts`). Measured on the
# 500k-row corpora: 126 MB of CSV (high-cardinality text) are 192 MB kept, and the job's
# peak RSS went from 500 to 631 MB; 76 MB of CSV (low), 144 MB, 417 -> 527 MB; at 1M
# rows (152 MB of CSV, more than the budget holds) 403 -> 633 MB. 256 MiB holds a CSV
# of 140-175 MB (1.5-1.9 bytes kept a byte) and bounds what a larger one adds.
_BUDGET_BYTES = 256 * 2**20


class ParsedChunks:
    """A process-wide store of parsed chunks by (job, work item), within a byte budget.

    Keys hold the job's id, so a job never takes another's chunks; a new job's first
    keeper drops whatever an earlier job left (one that failed between its passes).
    """

    def __init__(self, budget_bytes: int = _BUDGET_BYTES):
        self.budget = budget_bytes
        self._lock = threading.Lock()
        self._held: dict = {}  # (job, item key) -> ([Chunk], bytes)
        self._job = None

    def keeper(self, job: str, item_key) -> "Keeper":
        with self._lock:
            if self._job != job:
                self._held.clear()
                self._job = job
            self._held.pop((job, item_key), None)  # a retried item starts over
        return Keeper(self, (job, item_key))

    def held_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._held.values())

    def _put(self, key, chunks: list, size: int) -> None:
        with self._lock:
            if key[0] == self._job and sum(s for _, s in self._held.values()) + size <= self.budget:
                self._held[key] = (chunks, size)

    def take(self, job: str, item_key) -> list | None:
        """The chunks kept for this item, in order, removed from the store; None if none were."""
        with self._lock:
            found = self._held.pop((job, item_key), None)
        return None if found is None else found[0]


class Keeper:
    """Collects one work item's chunks as the first pass parses them (`add`), and hands
    them to the store once the item was read to its end (`publish`): a pass that failed
    half-way keeps nothing. Past the budget it lets them go and keeps no more."""

    def __init__(self, store: ParsedChunks, key):
        self._store, self._key = store, key
        self._chunks: list | None = []
        self._size = 0

    def add(self, chunk) -> None:
        if self._chunks is None:
            return
        self._size += chunk.batch.nbytes + sum(_nbytes(c) for casts in chunk.casts.values() for c in casts.values())
        if self._size + self._store.held_bytes() > self._store.budget:
            self._chunks = None
            return
        self._chunks.append(chunk)

    def publish(self) -> None:
        # Nothing kept, nothing published: a source that keeps no chunks (its items hold
        # their rows) or an empty range is read as before.
        if self._chunks:
            self._store._put(self._key, self._chunks, self._size)


def _nbytes(cast) -> int:
    """An array's bytes, or a (float32 array, numpy mask) pair's."""
    return sum(a.nbytes for a in cast) if isinstance(cast, tuple) else cast.nbytes


KEPT = ParsedChunks()
