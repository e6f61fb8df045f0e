"""The conversion's own error type, shared by the launcher and the pipeline's stages, and
the message for a storage call that failed."""

from __future__ import annotations

import contextlib
import errno
import json
import re

__all__ = ["ConversionError", "full_disk_named", "is_denied", "open_named", "root_cause", "storage_error"]

_FULL = (errno.ENOSPC, errno.EDQUOT)

_ROLES = {
    "--input": "roles/storage.objectViewer on the input's bucket",
    "--output": "roles/storage.objectAdmin on the output's bucket",
    "--schema_from": "roles/storage.objectViewer on the bucket of the dataset whose schema it carries",
    "--schema": "roles/storage.objectViewer on the schema file's bucket",
}
# google-cloud-storage's errors read "403 GET <url>: <GCS's message>"; the path is named already.
# A download's message is GCS's JSON body instead, then the transport's own words:
# '403 GET <url>: {"error": {"code": 403, "message": ...}}: (\'Request failed ...\')'.
_REQUEST = re.compile(r"^(\d{3} )[A-Z]+ https?://\S+: ")


class ConversionError(RuntimeError):
    """A conversion cannot go on; the message names the input or output and what to do."""


def root_cause(e: BaseException) -> BaseException:
    """The error the storage raised, under Beam's wrapping: a BeamIOError holds its
    per-path errors in `exception_details` (nested for a match of a listing)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        details = getattr(e, "exception_details", None)
        if isinstance(details, dict) and details:
            e = next(iter(details.values()))
        elif e.__cause__ is not None:
            e = e.__cause__
        else:
            break
    return e


def _denied(e: BaseException) -> bool:
    # google.api_core's Forbidden and Unauthorized carry the HTTP status as `code`.
    return isinstance(e, PermissionError) or getattr(e, "code", None) in (401, 403)


def _permission_fix(flag: str, path: str) -> str:
    if not path.startswith("gs://"):
        return "give the user the job runs as access to it, or choose another path"
    return (
        f"grant the account the job runs as {_ROLES[flag]} (on Dataflow: the workers' service account), "
        "or check the credentials this machine uses (gcloud auth application-default login)"
    )


def is_denied(e: BaseException) -> bool:
    """Whether `e`, under Beam's wrapping, is a refused permission."""
    return _denied(root_cause(e))


def _reason(cause: BaseException) -> str:
    """The storage's own words for `cause`: the status and GCS's message, without the URL,
    the JSON around the message, or the transport's repetition of the status."""
    text = str(cause).strip()
    request = _REQUEST.match(text)
    if request is None:
        return text.rstrip(".") or type(cause).__name__
    rest = text[request.end() :]
    if rest.startswith("{"):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            body, _ = json.JSONDecoder().raw_decode(rest)
            rest = str(body["error"]["message"])
    return (request.group(1) + rest).rstrip(".")


def storage_error(doing: str, flag: str, path: str, e: BaseException, kind=ConversionError) -> ConversionError:
    """The error (`kind`) for `flag`'s `path` when the filesystem refused `doing` it:
    the storage's own reason, and for a refused permission the role to grant."""
    cause = root_cause(e)
    reason = _reason(cause)
    if _denied(cause):
        return kind(f"permission denied on {flag} {path}: {reason}; {_permission_fix(flag, path)}")
    return kind(f"cannot {doing} {flag} {path}: {reason}")


def open_named(flag: str, path: str):
    """`path` opened for reading through Beam's filesystems, its failures naming `flag` and
    `path` (`storage_error`). Beam opens a GCS object lazily (its first request is the first
    read, or the size a seek to the end asks for), so a refused object fails in a read, deep
    in Arrow's or the job's code, not in the open: each call of the file is wrapped."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as e:  # Beam raises several types
        raise storage_error("open", flag, path, e, OSError) from e
    return _NamedFile(raw, flag, path)


class _NamedFile:
    """A file whose storage failures (a refused permission, an HTTP status) name it."""

    def __init__(self, raw, flag: str, path: str):
        self._raw, self._flag, self._path = raw, flag, path

    def __getattr__(self, name):
        attr = getattr(self._raw, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except Exception as e:
                cause = root_cause(e)
                # Not an OSError: the readers take an OSError in a read for a damaged file.
                if _denied(cause) or isinstance(getattr(cause, "code", None), int):
                    raise storage_error("read", self._flag, self._path, e) from e
                raise

        return call

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._raw.close()


@contextlib.contextmanager
def full_disk_named(where: str):
    """Turns a full disk (or quota) met inside into a ConversionError naming the path (the
    error's own, else `where`) and the fix: a write's OSError names no file."""
    try:
        yield
    except Exception as e:
        cause = root_cause(e)
        if not (isinstance(cause, OSError) and cause.errno in _FULL):
            raise
        path = cause.filename or where
        raise ConversionError(
            f"no space left on the device holding {path} ({cause.strerror}): free space there, or give the job "
            "room elsewhere (--output for the dataset, TMPDIR for the commit's spill files); no dataset was "
            "written, and the next run removes this one's temp dir"
        ) from e
