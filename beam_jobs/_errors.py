"""The conversion's own error type, shared by the launcher and the pipeline's stages, and
the message for a storage call that failed."""

from __future__ import annotations

import contextlib
import errno
import re

__all__ = ["ConversionError", "full_disk_named", "is_denied", "root_cause", "storage_error"]

_FULL = (errno.ENOSPC, errno.EDQUOT)

_ROLES = {
    "--input": "roles/storage.objectViewer on the input's bucket",
    "--output": "roles/storage.objectAdmin on the output's bucket",
    "--schema_from": "roles/storage.objectViewer on the bucket of the dataset whose schema it carries",
}
# google-cloud-storage's errors read "403 GET <url>: <GCS's message>"; the path is named already.
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


def storage_error(doing: str, flag: str, path: str, e: BaseException, kind=ConversionError) -> ConversionError:
    """The error (`kind`) for `flag`'s `path` when the filesystem refused `doing` it:
    the storage's own reason, and for a refused permission the role to grant."""
    cause = root_cause(e)
    reason = _REQUEST.sub(r"\1", str(cause).strip()).rstrip(".") or type(cause).__name__
    if _denied(cause):
        return kind(f"permission denied on {flag} {path}: {reason}; {_permission_fix(flag, path)}")
    return kind(f"cannot {doing} {flag} {path}: {reason}")


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
