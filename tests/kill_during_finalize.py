"""Runs a conversion and kills its process (os._exit, as SIGKILL would) at one point of Finalize.

    python -m tests.kill_during_finalize POINT convert-args...

POINT is where the process dies:
  after_plan     the commit plan is written, nothing moved yet
  mid_moves      the first shard is moved into place, the others are not
  before_swap    every new file is in place, the old metadata still stands
  after_swap     the new metadata is in place, the old files are not deleted yet
  mid_cleanup    the old files are deleted, the temp dir only in part
Exits 0 if it never reached POINT (a test error), else 9.
"""

from __future__ import annotations

import os
import sys

from apache_beam.io.filesystems import FileSystems

from beam_jobs import convert
from beam_jobs.output import directory as output_dir
from ingest import contract

KILLED = 9


def _die() -> None:
    sys.stdout.flush()
    os._exit(KILLED)


def _arm(point: str) -> None:
    write_text, rename = output_dir.write_text, FileSystems.rename
    delete_dataset_files, delete_tree = output_dir.delete_dataset_files, output_dir.delete_tree

    def writing(path, text):
        if point == "before_swap" and path.endswith("/" + contract.METADATA_FILENAME):
            _die()
        write_text(path, text)
        if point == "after_plan" and path.endswith("/" + output_dir.COMMIT_FILE):
            _die()

    def renaming(sources, destinations):
        if point == "mid_moves" and len(sources) > 1:
            rename(sources[:1], destinations[:1])
            _die()
        rename(sources, destinations)

    def deleting_old(output, rels, *, listed_in):
        if point == "after_swap":
            _die()
        delete_dataset_files(output, rels, listed_in=listed_in)

    def deleting_tree(path):
        if point == "mid_cleanup":
            _die()
        delete_tree(path)

    output_dir.write_text = writing
    FileSystems.rename = staticmethod(renaming)
    output_dir.delete_dataset_files = deleting_old
    output_dir.delete_tree = deleting_tree


if __name__ == "__main__":
    _arm(sys.argv[1])
    convert.run(sys.argv[2:])
