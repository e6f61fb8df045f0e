"""Who owns what in an output directory: job markers, stale jobs, foreign files, commits.

A conversion writes only inside its own temp dir (DIR/_ingest_tmp-<job>/) until
Finalize. Finalize records its plan there first (`commit.json`: which files it moves
into place, the metadata it writes, the old files it then deletes), moves new files
in under names the current dataset does not use, swaps the metadata last, and only
then deletes the old dataset's files. So the old dataset stays readable until the new
metadata lands, a retried Finalize repeats the same plan, and a rerun after a kill
finishes or undoes exactly what the dead job did. Nothing else is ever deleted: files
the job cannot prove it wrote make it refuse the directory instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
import shutil
import socket
import time

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from beam_jobs._errors import ConversionError, is_denied, storage_error
from ingest import contract

__all__ = [
    "JOB_FILE",
    "COMMIT_FILE",
    "DEFAULT_STALE_HOURS",
    "JobMarker",
    "OutputError",
    "claim_output",
    "temp_dir_of",
    "release",
    "dataset_files",
    "read_text",
    "write_text",
    "delete_tree",
    "remove_temp_dir",
    "refuse_undeletable",
    "delete_dataset_files",
    "literal_pattern",
]

logger = logging.getLogger(__name__)

JOB_FILE = "job.json"
COMMIT_FILE = "commit.json"
# A job on another machine (a Dataflow launcher, say) cannot be asked whether it lives;
# its temp dir counts as abandoned after this long without finishing.
DEFAULT_STALE_HOURS = 24.0


# Jobs of this process that claimed a directory and have not released it (convert.run).
_RUNNING_HERE: set = set()


class OutputError(ConversionError):
    """The output directory cannot be used as it is; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class JobMarker:
    """`job.json` in a job's temp dir: who is writing, since when, and whether it ended."""

    job_id: str
    started: float  # Unix time
    host: str
    pid: int
    state: str = "running"  # "running" | "ended" (failed or stopped without a dataset)

    @classmethod
    def new(cls, job_id: str) -> "JobMarker":
        return cls(job_id=job_id, started=time.time(), host=socket.gethostname(), pid=os.getpid())

    def alive(self, *, now: float, stale_after_s: float) -> bool:
        if self.state != "running":
            return False
        if self.host == socket.gethostname():
            if self.pid == os.getpid():  # an earlier job of this process (a notebook's): done unless running
                return self.job_id in _RUNNING_HERE
            return _pid_alive(self.pid)
        return now - self.started < stale_after_s

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"job {self.job_id} (pid {self.pid} on {self.host}, started {when})"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "JobMarker":
        d = json.loads(text)
        return cls(
            job_id=str(d["job_id"]),
            started=float(d["started"]),
            host=str(d["host"]),
            pid=int(d["pid"]),
            state=str(d.get("state", "running")),
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


# --- small FileSystems helpers -------------------------------------------------------


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def fingerprint(path: str, size: int) -> str:
    """`contract.shard_fingerprint` of the file at `path`, of `size` bytes: two small reads."""
    n = contract.FINGERPRINT_BYTES
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        head = f.read(min(n, size))
        f.seek(max(0, size - n))
        tail = f.read(n)
    return contract.shard_fingerprint(size, head, tail)


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Writes `path` whole: to a sibling name first, then renamed over it."""
    tmp = path + ".writing"
    with FileSystems.create(tmp, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(text.encode("utf-8"))
    FileSystems.rename([tmp], [path])


def _list(output: str) -> list:
    """Every file below `output` (object-store 'directory' placeholders left out), its
    name taken literally: an --output named 'runs[1]' is no pattern."""
    return sorted(_files_under(output))


# --- deleting: only what a conversion provably wrote, each path literally -------------

# The names Finalize gives the files it moves into a dataset (`fresh` may add "-<job tag>"
# before the extension). Metadata can be edited or forged, so a name it lists is deleted
# only if it is one of these: never a path outside the directory, a directory, the
# metadata itself, a temp dir, or a pattern.
_WRITTEN_NAME = re.compile(
    r"(?:[A-Za-z][A-Za-z0-9_]*-\d{5,}-of-\d{5,}(?:-[0-9a-f]{1,12})?\.tfrecord(?:\.gz|\.index)?"
    rf"|{contract.QUARANTINE_DIRNAME}/part-\d{{5,}}-of-\d{{5,}}(?:-[0-9a-f]{{1,12}})?\.jsonl"
    rf"|{contract.VOCABULARIES_DIRNAME}/\d{{5,}}(?:-[0-9a-f]{{1,12}})?\.json)"
)
_GLOB_CHARS = re.compile(r"[*?\[\]{}]")


def refuse_undeletable(output: str, rels, *, listed_in: str) -> None:
    """Raises OutputError naming the first of `rels` (paths relative to `output`, read
    from `listed_in`) that is not a name a conversion writes; deletes nothing."""
    for rel in rels:
        if not isinstance(rel, str) or not _WRITTEN_NAME.fullmatch(rel):
            raise OutputError(
                f"{listed_in} names {rel!r} as a file of the dataset in {output}, but no conversion writes that "
                "name (only shards such as train-00000-of-00004.tfrecord, their block indexes such as "
                "train-00000-of-00004.tfrecord.index, quarantine/part-*.jsonl and vocabularies/*.json); the job "
                "deletes nothing it "
                f"cannot prove it wrote, so nothing was deleted. Restore {listed_in} from the conversion that "
                "wrote it, remove the entry, or choose another --output"
            )
    refuse_links_out(output, rels)


def refuse_links_out(output: str, rels) -> None:
    """Raises OutputError if a symlinked folder below a local `output` would lead one of
    `rels` elsewhere: names alone do not keep a deletion or a write inside --output.

    Only folders are resolved: a file that is itself a link is deleted or replaced as a
    link, never through it."""
    if not _is_local(output):
        return  # object stores have no links
    root = os.path.realpath(output)
    for folder in sorted({posixpath.dirname(rel) for rel in rels} - {""}):
        path = os.path.join(output, folder)
        real = os.path.realpath(path)
        if real != os.path.normpath(os.path.join(root, folder)):
            raise OutputError(
                f"{path} is a link to {real}: the job writes and deletes files only inside --output {output}, "
                "never through a link out of it, so nothing was deleted or written; replace the link with a "
                "folder (moving in the files it holds), or choose another --output"
            )


def delete_dataset_files(output: str, rels, *, listed_in: str) -> None:
    """The one way a job deletes files of a dataset: the old dataset's after a swap, or
    what a dead job had moved in. All are checked before any is deleted."""
    rels = list(rels)
    refuse_undeletable(output, rels, listed_in=listed_in)
    _delete_literally([p for p in (FileSystems.join(output, rel) for rel in rels) if FileSystems.exists(p)])


def _is_local(path: str) -> bool:
    return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def literal_pattern(path: str) -> str:
    """`path` as a Beam match pattern that matches it alone (a class of one character
    quotes a metacharacter: Beam's patterns have no escape)."""
    return re.sub(r"[*?\[]", lambda m: f"[{m.group()}]", path)


def _delete_literally(paths) -> None:
    """Deletes exactly these files. `FileSystems.delete` would take each path for a
    pattern, and remove a local directory with everything below it."""
    local = [p for p in paths if _is_local(p)]
    for path in local:
        if os.path.isdir(path) and not os.path.islink(path):
            raise OutputError(f"{path} is a directory where the job wrote a file; nothing in it was deleted")
        os.remove(path)
    remote = [literal_pattern(p) for p in paths if p not in local]
    if remote:
        FileSystems.delete(remote)


def _files_under(path: str) -> list:
    pattern = FileSystems.join(literal_pattern(path), "**")
    return [m.path for r in FileSystems.match([pattern]) for m in r.metadata_list if not m.path.endswith("/")]


def delete_tree(temp_dir: str) -> None:
    """Deletes a temp dir this job created or proved a conversion's (its marker names it).
    Locally without following links out of it; on object stores, its objects literally."""
    if _is_local(temp_dir):
        if os.path.lexists(temp_dir):
            shutil.rmtree(temp_dir)
        return
    _delete_literally(_files_under(temp_dir))


def remove_temp_dir(temp_dir: str) -> None:
    """Deletes a job's temp dir with its marker last, so that a kill part-way leaves a
    dir a rerun still recognises as that job's."""
    marker = FileSystems.join(temp_dir, JOB_FILE)
    if _is_local(temp_dir):
        for entry in os.scandir(temp_dir) if os.path.isdir(temp_dir) else ():
            if entry.name != JOB_FILE:
                (shutil.rmtree if entry.is_dir(follow_symlinks=False) else os.remove)(entry.path)
    else:
        _delete_literally([p for p in _files_under(temp_dir) if p != marker])
    delete_tree(temp_dir)


def dataset_files(info: contract.DatasetInfo) -> list:
    """The files a dataset's metadata lists, relative to its directory."""
    files = [name for split in info.splits for shard in split.shards for name in (shard.filename, shard.index) if name]
    files += [q["path"] for q in info.quarantine.get("files", ())]
    files += [v["file"] for v in info.vocabularies.values()]
    return files


# --- claiming a directory at launch --------------------------------------------------


def _temp_dirs(output: str, files: list) -> dict:
    """{temp dir: [its files]} for the temp dirs of conversion jobs among `files`."""
    prefix = FileSystems.join(output, "")
    dirs: dict = {}
    for path in files:
        top = path[len(prefix) :].split("/", 1)[0]
        if top.startswith(contract.TEMP_PREFIX):
            dirs.setdefault(prefix + top, []).append(path)
    return dirs


def _marker(temp_dir: str, files: list) -> JobMarker | None:
    path = FileSystems.join(temp_dir, JOB_FILE)
    if path not in files:
        return None
    try:
        return JobMarker.from_json(read_text(path))
    except (ValueError, KeyError, TypeError):
        return None


def _read_metadata(output: str) -> contract.DatasetInfo | None:
    path = FileSystems.join(output, contract.METADATA_FILENAME)
    if not FileSystems.exists(path):
        return None
    try:
        return contract.DatasetInfo.from_json(read_text(path))
    except (ValueError, KeyError, TypeError) as e:
        raise OutputError(
            f"{path} exists but cannot be read as dataset metadata ({e}); the job will not write over "
            "a directory it cannot account for: repair or remove that file, or choose another --output"
        ) from e


def _recover(temp_dir: str, output: str, current: contract.DatasetInfo | None) -> None:
    """Finishes or undoes what a dead job's Finalize did, then removes its temp dir."""
    commit_path = FileSystems.join(temp_dir, COMMIT_FILE)
    if FileSystems.exists(commit_path):
        plan = json.loads(read_text(commit_path))
        moved = [rel for _, rel in plan["moves"]]
        refuse_undeletable(output, [*plan["old_files"], *moved], listed_in=commit_path)
        listed = set(dataset_files(current)) if current is not None else set()
        planned = contract.DatasetInfo.from_json(plan["metadata"])
        committed = current is not None and current.source.get("job") == planned.source.get("job")
        # Committed: the old files it meant to delete. Not committed: the files it had
        # already moved into place, which no metadata lists.
        doomed = plan["old_files"] if committed else moved
        delete_dataset_files(output, [rel for rel in doomed if rel not in listed], listed_in=commit_path)
        logger.info("%s the commit of an abandoned job in %s", "finished" if committed else "undid", temp_dir)
    remove_temp_dir(temp_dir)


def temp_dir_of(output: str, job_id: str) -> str:
    """Where job `job_id` writes until its Finalize: DIR/_ingest_tmp-<job>/."""
    return FileSystems.join(output, contract.TEMP_PREFIX + job_id)


def claim_output(output: str, *, overwrite: bool, job_id: str, stale_after_s: float, running_here: bool = True) -> str:
    """Checks `output` can take a new dataset, cleans up after dead jobs, and creates
    this job's temp dir with its marker. Returns the temp dir. `running_here`: the caller
    releases the claim when the job stops (`release`); without it, a later job of this
    process takes the temp dir for abandoned.

    Refuses (OutputError) a directory that holds a live job's temp dir, a dataset
    without `overwrite`, or any file that neither the dataset's metadata nor a job's
    temp dir accounts for; and one the storage refuses to list or write, naming the
    role to grant when it is a permission.
    """
    try:
        return _claim(output, overwrite, job_id, stale_after_s, running_here)
    except OutputError:
        raise
    except Exception as e:
        if isinstance(e, OSError) or is_denied(e):
            raise storage_error("use", "--output", output, e, OutputError) from e
        raise


def _claim(output: str, overwrite: bool, job_id: str, stale_after_s: float, running_here: bool) -> str:
    files = _list(output)
    now = time.time()
    current = _read_metadata(output)
    if current is not None:
        metadata_path = FileSystems.join(output, contract.METADATA_FILENAME)
        refuse_undeletable(output, dataset_files(current), listed_in=metadata_path)
    refuse_links_out(output, [f"{contract.QUARANTINE_DIRNAME}/part"])  # where this job's quarantine will go
    dead = []
    for temp_dir, its_files in sorted(_temp_dirs(output, files).items()):
        marker = _marker(temp_dir, its_files)
        name = temp_dir.rsplit("/", 1)[-1]
        if marker is None or name != contract.TEMP_PREFIX + marker.job_id or _GLOB_CHARS.search(name):
            raise OutputError(
                f"{output} holds {temp_dir}/, a conversion temp dir without a readable {JOB_FILE} naming it (left "
                "by an older version of ingest, or not by ingest): the job will not delete what it cannot prove "
                "it wrote; remove that directory yourself, or choose another --output"
            )
        if marker.alive(now=now, stale_after_s=stale_after_s):
            raise OutputError(_busy_message(output, marker, temp_dir, stale_after_s))
        dead.append(temp_dir)
    for temp_dir in dead:
        _recover(temp_dir, output, current)
    if current is not None and not overwrite:
        raise OutputError(
            f"{output} already holds a dataset ({contract.METADATA_FILENAME}); pass --overwrite "
            "to replace it, or choose another --output"
        )
    known = {FileSystems.join(output, rel) for rel in dataset_files(current)} if current else set()
    known.add(FileSystems.join(output, contract.METADATA_FILENAME))
    foreign = [p for p in _list(output) if p not in known]
    if foreign:
        raise OutputError(
            f"{output} holds {len(foreign)} file(s) that no conversion of this dataset wrote, e.g. {foreign[0]}; "
            "the job only writes into an empty directory or one holding a dataset it made, and never deletes "
            "other files: move them away, or choose another --output"
        )
    temp_dir = temp_dir_of(output, job_id)
    marker = JobMarker.new(job_id)
    if running_here:
        _RUNNING_HERE.add(job_id)
    write_text(FileSystems.join(temp_dir, JOB_FILE), marker.to_json())
    _refuse_if_not_first(output, temp_dir, marker, stale_after_s)
    return temp_dir


def _refuse_if_not_first(output: str, temp_dir: str, mine: JobMarker, stale_after_s: float) -> None:
    """Two jobs that checked the directory at the same moment both see each other's
    marker now; the one that started first keeps the directory."""
    now = time.time()
    for other_dir, its_files in sorted(_temp_dirs(output, _list(output)).items()):
        if other_dir == temp_dir:
            continue
        other = _marker(other_dir, its_files)
        if (
            other is not None
            and other.alive(now=now, stale_after_s=stale_after_s)
            and (other.started, other.job_id) < (mine.started, mine.job_id)
        ):
            _RUNNING_HERE.discard(mine.job_id)
            delete_tree(temp_dir)
            raise OutputError(_busy_message(output, other, other_dir, stale_after_s))


def _busy_message(output: str, marker: JobMarker, temp_dir: str, stale_after_s: float) -> str:
    return (
        f"another conversion is writing into {output}: {marker.describe()}, temp dir {temp_dir}/. Wait for it to "
        f"finish or choose another --output; if that job is dead, remove its temp dir (a job on another machine "
        f"counts as dead {stale_after_s / 3600:g} h after it started, --stale_job_hours)"
    )


def release(temp_dir: str) -> None:
    """Marks a job that stopped without a dataset as ended, so the next run may clean up
    its temp dir (kept until then: its quarantine explains the failure)."""
    path = FileSystems.join(temp_dir, JOB_FILE)
    _RUNNING_HERE.discard(temp_dir.rsplit("/", 1)[-1].removeprefix(contract.TEMP_PREFIX))
    try:
        if FileSystems.exists(path):
            marker = JobMarker.from_json(read_text(path))
            write_text(path, JobMarker(**{**dataclasses.asdict(marker), "state": "ended"}).to_json())
    except Exception:  # best effort: a marker left 'running' goes stale on its own
        logger.debug("could not mark %s as ended", temp_dir, exc_info=True)
