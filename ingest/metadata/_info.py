"""Reading a dataset's metadata: local paths without TensorFlow, gs:// through its filesystems."""

from __future__ import annotations

from ingest import contract
from ingest.metadata import _files, _spans

__all__ = ["load_info", "load_spans", "read_vocabulary", "DatasetNotFoundError", "DatasetInfoError"]

_HOW_TO_CREATE = "create one with: python -m beam_jobs.convert --source csv --input 'data/*.csv' --output DIR"


class DatasetNotFoundError(FileNotFoundError):
    pass


class DatasetInfoError(ValueError):
    """The metadata file exists but cannot be used: the message names the file and what is wrong."""


def load_info(path) -> contract.DatasetInfo:
    """Returns the metadata of the converted dataset at `path`.

    `path` may also be a list of datasets or a glob of them (spans read as one, as
    `make_dataset` takes them): their features, which must agree, their splits' shards
    together, and their statistics merged as if their rows had been converted together.
    """
    return load_spans(path).info


def load_spans(path) -> _spans.Spans:
    """The datasets `path` names (one, a list, or a glob), their metadata, and one view of them."""
    paths = _spans.resolve(path)
    view = _spans.merged(paths, tuple(_load_one(p) for p in paths))
    # DatasetInfo.vocabulary reads its files under the view's root.
    object.__setattr__(view.info, "_read_vocabulary", lambda name: read_vocabulary(view.root, view.info, name))
    return view


def read_vocabulary(path: str, info: contract.DatasetInfo, name: str) -> tuple:
    """The vocabulary of text feature `name` of the dataset at `path` (its metadata `info`)."""
    file = f"{str(path).rstrip('/')}/{info.vocabularies[name]['file']}"
    try:
        data = _files.read_bytes(file)
    except OSError as e:
        raise DatasetInfoError(
            f"{file}, the vocabulary of feature {name!r}, cannot be read ({e}): copy it along with the dataset, "
            "or reconvert the dataset"
        ) from e
    try:
        return contract.parse_vocabulary(data, info.vocabularies[name])
    except ValueError as e:
        raise DatasetInfoError(
            f"{file}, the vocabulary of feature {name!r}, is not the one converted: {e}. Restore it (copy it along "
            "with the dataset), or reconvert the dataset"
        ) from e


def _load_one(path: str) -> contract.DatasetInfo:
    path = str(path).rstrip("/")
    meta = f"{path}/{contract.METADATA_FILENAME}"
    try:
        if _files.exists(meta):
            return _parse(meta, _files.read_bytes(meta))
        exists = _files.isdir(path)
        children = _files.listdir(path) if exists else []
    except PermissionError as e:
        raise PermissionError(
            f"permission denied reading the dataset at {path}: {e}. Give the account read access "
            "(e.g. roles/storage.objectViewer on the bucket) or check its credentials "
            "(gcloud auth application-default login)"
        ) from e
    except OSError as e:
        raise DatasetNotFoundError(f"cannot read dataset at {path}: {e}") from e
    if not exists:
        if _files.exists(path):
            raise DatasetNotFoundError(
                f"{path} is a file, not a converted dataset: give make_dataset the directory a conversion wrote "
                f"(it holds {contract.METADATA_FILENAME}); {_HOW_TO_CREATE}"
            )
        raise DatasetNotFoundError(f"no dataset at {path}: the directory does not exist; {_HOW_TO_CREATE}")
    leftovers = [c for c in children if ".tfrecord" in c or c.startswith(contract.TEMP_PREFIX)]
    if leftovers:
        raise DatasetNotFoundError(
            f"{path} holds an incomplete dataset: it has {len(leftovers)} shard or temporary file(s) but no "
            f"{contract.METADATA_FILENAME}, so its conversion did not finish. Rerun the conversion into it."
        )
    raise DatasetNotFoundError(f"{path} is not a converted dataset (no {contract.METADATA_FILENAME}); {_HOW_TO_CREATE}")


def _parse(meta: str, data: bytes) -> contract.DatasetInfo:
    try:
        return contract.DatasetInfo.from_json(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        fix = (
            ""
            if "format_version" in str(e)
            else (". The file was edited, or only partly written or copied: restore it, or reconvert the dataset")
        )
        raise DatasetInfoError(f"{meta} is not usable dataset metadata: {e}{fix}") from e
