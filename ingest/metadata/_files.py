"""The file operations that reading metadata needs, without TensorFlow for local paths.

`ingest describe`, `ingest compare`, `load_info` and `spans` read a small JSON file and
list directories: importing TensorFlow for that took 4-8 s and printed its start-up lines.
Local paths use the standard library; a path with a scheme (gs://, s3://, ...) goes
through TensorFlow's filesystems, as the rest of ingest reads them. Errors are the
standard library's either way (PermissionError, OSError), so callers catch one family.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import os

from ingest import _optional

__all__ = ["exists", "isdir", "listdir", "glob", "read_bytes", "is_remote"]


def is_remote(path) -> bool:
    return "://" in os.fspath(path)


@contextlib.contextmanager
def _as_os_errors():
    """TensorFlow's errors as the standard library's, the message kept."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.PermissionDeniedError as e:
        raise PermissionError(e.message) from e
    except tf.errors.NotFoundError as e:
        raise FileNotFoundError(e.message) from e
    except tf.errors.OpError as e:
        raise OSError(e.message) from e


def _gfile(path: str):
    return _optional.tensorflow(f"reading {path}").io.gfile


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    with _as_os_errors():
        return _gfile(path).exists(path)


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    with _as_os_errors():
        return _gfile(path).isdir(path)


def listdir(path: str) -> list:
    if not is_remote(path):
        return os.listdir(path)
    with _as_os_errors():
        return _gfile(path).listdir(path)


def glob(pattern: str) -> list:
    if not is_remote(pattern):
        return _glob.glob(pattern)
    with _as_os_errors():
        return _gfile(pattern).glob(pattern)


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    with _as_os_errors():
        with _gfile(path).GFile(path, "rb") as f:
            return f.read()
