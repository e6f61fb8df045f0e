"""The read stage: a split's shard files -> serialized records, each shard checked against the metadata.

    shard list (shuffled per epoch) -> [file-level sharding by input pipeline]
      -> parallel interleave of TFRecordDataset blocks (large read buffer), each shard's
         record count checked as it ends -> unbatch
      -> [record-level sharding, when files < input pipelines]

Missing shards are refused (or announced, with skip_corrupt) before the graph is built;
corrupt, truncated, short or overlong shards are caught while reading, named. In the
blocks layout a record is a block of rows: shards are counted in blocks, sharded by block
when files are fewer than pipelines, and losses are counted in rows.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import TYPE_CHECKING

import tensorflow as tf

from ingest import contract
from ingest.pipeline import _tuning
from ingest.pipeline._system import usable_cpus
from ingest.pipeline.blocks.parse import check_blocks

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["fingerprint_check", "glob_escaped", "records", "shard_plan", "skipped_corrupt_records"]

logger = logging.getLogger(__name__)

_skipped_lock = threading.Lock()
_skipped: dict = {}
# (file, size, fingerprint) of the shards this process found as the conversion wrote them:
# each is read at its ends once, not at every open (the seekable order opens a shard per window).
_fingerprinted: set = set()


def _check_fingerprints(names, sizes, fingerprints, skip_corrupt):  # runs inside tf.data, through py_function
    check_shards(zip(names.numpy(), sizes.numpy().tolist(), fingerprints.numpy()), skip_corrupt=bool(skip_corrupt))
    return 0


def check_shards(shards, *, skip_corrupt: bool = False) -> None:
    """(name, size, fingerprint) -> fails naming the first shard of the recorded size whose
    ends are not the ones the conversion wrote (`contract.shard_fingerprint`); names and
    fingerprints as str or bytes. Each shard is read once per process.

    With `skip_corrupt` such a shard is logged and read: its ends may be corrupt, and its
    records' CRCs then skip what is (a swapped shard's records would pass them)."""
    for name, size, expected in shards:
        name = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
        expected = expected.decode() if isinstance(expected, bytes) else expected
        key = (name, int(size), expected)
        if not expected or key in _fingerprinted:
            continue  # converted before fingerprints were recorded, or checked already
        try:
            ends = _ends(name, int(size))
        except tf.errors.NotFoundError:
            continue  # the missing-shard checks name it (a stat cache may still list it)
        if ends is None:
            continue  # the record counts name a short or long shard, or skip it with skip_corrupt
        if contract.shard_fingerprint(int(size), *ends) != expected:
            why = (
                f"shard {name} is not the file the conversion wrote: it has the size {contract.METADATA_FILENAME} "
                f"records ({size} bytes) but other bytes at its ends (its fingerprint differs: corrupt, or a shard "
                "of another conversion swapped in)"
            )
            if not skip_corrupt:
                raise ValueError(
                    f"{why}. Restore the shard the conversion wrote or reconvert the dataset, or pass "
                    "skip_corrupt=True to read it and skip its corrupt records"
                )
            logger.warning("%s; read with skip_corrupt=True, its corrupt records will be skipped", why)
        _fingerprinted.add(key)


def _ends(name: str, size: int):
    """(head, tail) of a shard of `size` bytes; None when its size is another."""
    n = contract.FINGERPRINT_BYTES
    if not _tuning.is_remote(name):
        # Two preads: GFile reads ahead (~0.5 MB a shard measured), ten times the shard's
        # share of the bytes a build may read (test_block_index_files).
        try:
            fd = os.open(name, os.O_RDONLY)
        except FileNotFoundError as e:
            raise tf.errors.NotFoundError(None, None, str(e)) from e
        try:
            if os.fstat(fd).st_size != size:
                return None
            return os.pread(fd, n, 0), os.pread(fd, n, max(size - n, 0))
        finally:
            os.close(fd)
    if tf.io.gfile.stat(name).length != size:
        return None
    with tf.io.gfile.GFile(name, "rb") as f:
        head = f.read(n)
        f.seek(max(size - n, 0))
        return head, f.read(n)


def recorded_shards(req: Request, files) -> list:
    """The split's ShardInfo of each of `files` (paths as `shard_plan` makes them), None
    for a file it does not list."""
    by_file = {f"{req.path}/{s.filename}": s for s in req.split.shards}
    return [by_file.get(f) for f in files]


def fingerprint_check(req: Request, files):
    """files -> (their [n] names -> an op that fails naming the first whose size is the one
    recorded but whose ends are not (`contract.shard_fingerprint`)), or None where it cannot
    run: under the tf.data service (its workers run no Python) or with no fingerprint recorded.

    A shard of another conversion with the same name, size and record count passes every
    count; its ends (records, CRCs and lengths) tell it. Each shard is read at its ends once
    per process, when a pipeline first opens it.
    """
    shards = recorded_shards(req, files)
    if req.service is not None or not any(s is not None and s.fingerprint for s in shards):
        return None
    sizes = tf.constant([s.bytes if s is not None else -1 for s in shards], tf.int64)
    fingerprints = tf.constant([(s.fingerprint or "") if s is not None else "" for s in shards])

    def check(positions, names):
        given = [names, tf.gather(sizes, positions), tf.gather(fingerprints, positions), req.skip_corrupt]
        return tf.py_function(_check_fingerprints, given, tf.int64)

    return check


def skipped_corrupt_records() -> dict:
    """Records lost to corruption in this process, per shard path (with `skip_corrupt=True`)."""
    with _skipped_lock:
        return dict(_skipped)


_COUNT_BLOCK = 64  # records per block read from a shard: amortizes the checks and the interleave

_SHARD_FIX = "Reconvert the dataset, or pass skip_corrupt=True to skip the rest of a bad shard."
_MISSING_FIX = "Restore the file or reconvert the dataset, or pass skip_corrupt=True to skip its records."
_DISAGREE_FIX = (
    f"The metadata and the shard disagree: the shard was replaced or appended to after conversion, or "
    f"{contract.METADATA_FILENAME} comes from another conversion. Reconvert the dataset."
)


def _shard_problem(name: str, expected: int, read: int, unit: str = "records") -> tuple:
    """(what is wrong, what to do) for a shard that did not yield the records its metadata lists.

    `unit` names its TFRecords: "records" (rows layout) or "blocks" (blocks of rows).
    """
    if read > expected:
        return (
            f"shard {name} holds more {unit} than its metadata says: read {read} (at least), "
            f"{contract.METADATA_FILENAME} lists {expected}",
            _DISAGREE_FIX,
        )
    if read == 0 and not _exists(name):
        return (
            f"shard {name} is missing: {contract.METADATA_FILENAME} lists it with {expected} {unit}, "
            "but the file does not exist (deleted or moved after conversion?)",
            _MISSING_FIX,
        )
    return (
        f"shard {name} is corrupt, truncated or unreadable: read {read} of {expected} {unit} "
        "(the underlying error is logged above)",
        _SHARD_FIX,
    )


def _exists(name: str) -> bool:
    try:
        return tf.io.gfile.exists(name)
    except tf.errors.OpError:  # unreadable (permissions, network): not known to be missing
        return True


def _note_skipped(filename, expected, read, lost, unit="records"):  # runs inside tf.data, through py_function
    """Counts `lost` rows of a short shard as skipped (`expected` and `read` count its `unit`)."""
    name = filename.numpy().decode("utf-8", "replace")
    expected, read, lost = int(expected.numpy()), int(read.numpy()), int(lost.numpy())
    problem, fix = _shard_problem(name, expected, read, unit)
    if read > expected:
        # Not corruption that skipping can repair: which records are the right ones is unknown.
        raise tf.errors.DataLossError(
            None,
            None,
            f"{problem}. {fix} (skip_corrupt=True does not apply: "
            "no record is corrupt, and which ones belong is unknown)",
        )
    with _skipped_lock:
        _skipped[name] = _skipped.get(name, 0) + lost
    logger.warning("skipped %d record(s): %s", lost, problem)
    return lost


def _shard_error(filename, expected, read, lost, unit="records"):  # runs inside tf.data, through py_function
    name = filename.numpy().decode("utf-8", "replace")
    problem, fix = _shard_problem(name, expected=int(expected.numpy()), read=int(read.numpy()), unit=unit)
    raise tf.errors.DataLossError(None, None, f"{problem}. {fix}")


def _rows_of_blocks(blocks):
    """[N] rows held by each of a [N] batch of serialized blocks (their `__rows__`)."""
    spec = {contract.BLOCK_ROWS_FEATURE: tf.io.FixedLenFeature([1], tf.int64)}
    return tf.reshape(tf.io.parse_example(blocks, spec)[contract.BLOCK_ROWS_FEATURE], [-1])


def _check_block_rows(filename, first, rows, expected, expected_rows, block_rows: int):
    """An assert that blocks `first`, `first` + 1, ... of a shard hold the rows its metadata
    implies: `block_rows` each, the shard's last block the rest. Blocks past the metadata's
    count are left to the count check."""
    positions = first + tf.range(tf.size(rows, out_type=tf.int64))
    last = expected_rows - block_rows * (expected - 1)
    want = tf.where(positions < expected - 1, tf.constant(block_rows, tf.int64), last)
    return check_blocks(
        tf.logical_or(tf.equal(rows, want), positions >= expected),
        lambda i: tf.strings.join(
            ["shard ", filename, " block ", tf.strings.as_string(tf.gather(positions, i))]
            + [" holds ", tf.strings.as_string(tf.gather(rows, i)), f" rows, but {contract.METADATA_FILENAME} lists "]
            + [tf.strings.as_string(tf.gather(want, i)), f" ({block_rows} a block, the shard's last the rest). "]
            + [_DISAGREE_FIX]
        ),
    )


def glob_escaped(names):
    """Paths as matching_files patterns that match only themselves (glob characters escaped)."""
    return tf.strings.regex_replace(names, r"([*?\[\]\\])", r"\\\1")


def _exists_in_graph(filename):
    return tf.size(tf.io.matching_files(glob_escaped(filename))) > 0


def _short_in_graph(filename, expected, total, lost, *, unit: str, skip_corrupt: bool):
    """A shard that ended short (or is missing), reported in the graph: the tf.data service's
    workers run it in another process, where there is no py_function."""
    missing = tf.logical_and(tf.equal(total, 0), tf.logical_not(_exists_in_graph(filename)))
    n, read = tf.strings.as_string(expected), tf.strings.as_string(total)
    problem = tf.where(
        missing,
        tf.strings.join(
            [
                "shard ",
                filename,
                f" is missing: {contract.METADATA_FILENAME} lists it with ",
                n,
                f" {unit}, but the file does not exist",
            ]
        ),
        tf.strings.join(
            ["shard ", filename, " is corrupt, truncated or unreadable: read ", read, " of ", n, f" {unit}"]
        ),
    )
    if skip_corrupt:
        done = tf.print(tf.strings.join(["warning: skipped ", tf.strings.as_string(lost), " record(s): ", problem]))
    else:
        fix = tf.where(missing, _MISSING_FIX, _SHARD_FIX)
        done = tf.debugging.Assert(False, [tf.strings.join([problem, ". ", fix])])
    with tf.control_dependencies([done]):
        return tf.identity(lost)


def _too_many_in_graph(filename, expected, total, *, unit: str):
    done = tf.debugging.Assert(
        False,
        [
            tf.strings.join(
                [
                    "shard ",
                    filename,
                    f" holds more {unit} than its metadata says: read ",
                    tf.strings.as_string(total),
                    f" (at least), {contract.METADATA_FILENAME} lists ",
                    tf.strings.as_string(expected),
                    ". ",
                    _DISAGREE_FIX,
                ]
            )
        ],
    )
    with tf.control_dependencies([done]):
        return tf.constant(0, tf.int64)


def _present(filename, shard, fingerprints):
    """[filename], or [] when it does not exist: looked up as the shard enters the
    interleave, after its fingerprint check, so a missing file is opened as no files."""
    checks = [] if fingerprints is None else [fingerprints(tf.reshape(shard, [1]), tf.reshape(filename, [1]))]
    with tf.control_dependencies(checks):
        exists = _exists_in_graph(filename)
    return tf.boolean_mask(tf.reshape(filename, [1]), tf.reshape(exists, [1]))


def _reader(req: Request, *, located: bool = False, fingerprints=None):
    """Reads one shard as blocks of records; checks it yields what the metadata promises.

    `located`: each record comes as (record, its shard's index in the plan's files, its
    position in the shard): blocks, whose rows the window parse then checks against the
    metadata (it parses them anyway).

    TFRecordDataset stops a file at its first corrupt or truncated record with an error
    that does not name the file. Here errors end the file quietly, and the count decides:
    a shortfall at the end raises an error naming the shard, or, with `skip_corrupt`, is
    logged and counted; a record beyond the count raises before it is delivered.

    A missing file must not reach TFRecordDataset under ignore_errors: it advances past
    read errors but not past a failed open, so ignore_errors would retry the open forever
    (100% CPU, a warning per try). So each shard is looked up as it enters the interleave,
    just before its open, and a missing one is read as no files: the count then reports
    it. A file deleted in the instant between lookup and open would still spin; bounding
    the retries in-graph (zip with a counter) costs every record a zip, 15-20% end to end
    on 11 small features, so it is not done.
    """
    opts, skip_corrupt = req.options, req.skip_corrupt
    compression = "GZIP" if req.info.compression == "gzip" else ""
    buffer = _tuning.read_buffer_bytes(remote=_tuning.is_remote(req.path), requested=opts.read_buffer_bytes)
    blocks_layout = req.info.layout == "blocks"
    unit = "blocks" if blocks_layout else "records"
    # Skipped losses are counted in rows: on blocks that takes each block's `__rows__`,
    # parsed only when skipping (a short shard's lost rows are its rows not read; parsing
    # every block costs the streaming order ~18% of its rows/s). Parsed, each block's rows
    # are also checked against the metadata: skipping never delivers rows a shard does
    # not list.
    count_rows = blocks_layout and skip_corrupt

    def on_problem(filename, expected, read, lost):
        return (_note_skipped if skip_corrupt else _shard_error)(filename, expected, read, lost, unit)

    def open_shard(filenames):
        return tf.data.TFRecordDataset(filenames, compression_type=compression, buffer_size=buffer)

    def read(filename, expected, expected_rows, shard):
        present = _present(filename, shard, fingerprints)
        if opts.symbolic_checkpoint:
            # ignore_errors cannot be checkpointed symbolically: a corrupt record raises TF's
            # own error, unnamed; missing files and wrong counts are still caught below.
            blocks = open_shard(present).batch(_COUNT_BLOCK)
        else:
            blocks = open_shard(present).ignore_errors(log_warning=True).batch(_COUNT_BLOCK)
        end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))  # an empty block marks the end

        def running_count(totals, block):
            total, rows = totals
            size = tf.shape(block, out_type=tf.int64)[0]
            if not count_rows:
                return (total + size, rows + size), (total + size, rows + size, size, block)
            per_block = _rows_of_blocks(block)
            checked = _check_block_rows(filename, total, per_block, expected, expected_rows, req.info.block_rows)
            with tf.control_dependencies([checked]):
                rows += tf.reduce_sum(per_block)
            return (total + size, rows), (total + size, rows, size, block)

        def check(total, rows, size, block):
            checked = _counted(total, rows, size, block)
            if not located:
                return checked
            # Two numbers a block: the window parse finds the shard's name and counts from them.
            return checked, tf.fill([size], shard), total - size + tf.range(size)

        def _counted(total, rows, size, block):
            short = tf.logical_and(tf.equal(size, 0), total < expected)
            lost = expected_rows - rows
            if req.service:
                on_short = functools.partial(
                    _short_in_graph, filename, expected, total, lost, unit=unit, skip_corrupt=skip_corrupt
                )
                on_extra = functools.partial(_too_many_in_graph, filename, expected, total, unit=unit)
            else:
                on_short = on_extra = lambda: tf.py_function(on_problem, [filename, expected, total, lost], tf.int64)  # noqa: E731
            done = tf.case([(total > expected, on_extra), (short, on_short)], default=lambda: tf.constant(0, tf.int64))
            with tf.control_dependencies([done]):
                return tf.identity(block)

        # Blocks, not records: the interleave's per-element cost is paid once per block
        # (1.6x end-to-end throughput on the benchmark); the caller unbatches.
        zero = tf.constant(0, tf.int64)
        return blocks.concatenate(end).scan((zero, zero), running_count).map(check)

    return read


def shard_plan(req: Request) -> _tuning.FileShards:
    """The files this input pipeline reads (all of them, unless it is one of several).

    In the blocks layout a record is a block: counts are blocks, and with fewer files than
    pipelines the blocks are sharded one by one.
    """
    shards = req.split.shards
    files = [f"{req.path}/{s.filename}" for s in shards]
    rows = [s.records for s in shards]
    if req.info.layout == "blocks":
        counts = [s.blocks for s in shards]
        return _tuning.shard_files(
            files, counts, num_pipelines=req.num_pipelines, pipeline_id=req.pipeline_id, rows=rows
        )
    return _tuning.shard_files(files, rows, num_pipelines=req.num_pipelines, pipeline_id=req.pipeline_id)


def records(req: Request, plan: _tuning.FileShards, *, located: bool = False) -> tf.data.Dataset:
    """Serialized records (rows, or blocks of rows) of this pipeline's shards, checked against the metadata.

    `located` (blocks): each block as (block, its shard's index in `plan.files`, its
    position there), for the window parse to check and name.
    """
    rows = plan.counts if plan.rows is None else plan.rows
    ds = tf.data.Dataset.from_tensor_slices(
        (
            list(plan.files),
            tf.constant(plan.counts, tf.int64),
            tf.constant(rows, tf.int64),
            tf.range(len(plan.files), dtype=tf.int64),  # which of plan.files
        )
    )
    if req.shuffle and plan.record_shard is None and len(plan.files) > 1:
        ds = ds.shuffle(len(plan.files), seed=req.seed, reshuffle_each_iteration=True)
    remote = _tuning.is_remote(req.path)
    opts = req.options
    cycle = _tuning.cycle_length(len(plan.files), remote=remote, cpu_count=usable_cpus(), requested=opts.cycle_length)
    parallel = _tuning.interleave_parallelism(cycle, remote=remote, requested=opts.num_parallel_calls)
    ds = ds.interleave(
        _reader(req, located=located, fingerprints=fingerprint_check(req, plan.files)),
        cycle_length=cycle,
        num_parallel_calls=parallel or tf.data.AUTOTUNE,
        # Record-level sharding needs the same record order in every pipeline.
        deterministic=True if plan.record_shard is not None else req.deterministic,
    ).unbatch()
    if plan.record_shard is not None:
        ds = ds.shard(*plan.record_shard)
    return ds
