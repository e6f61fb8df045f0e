"""TensorFlow is an extra (`ingest[tf]`): the conversion and its Dataflow workers go without it.

Whatever needs it imports it through here, so a machine without it gets the install
command instead of a bare ModuleNotFoundError (as TensorFlow Datasets does for its extras).
"""

from __future__ import annotations

__all__ = ["TF_INSTALL", "is_missing", "jax", "missing_tensorflow", "tensorflow", "torch"]

TF_INSTALL = "pip install 'ingest[tf]'"


def is_missing(error: ModuleNotFoundError, package: str) -> bool:
    """Whether `error` is `package` (or a module of it) not found, rather than something else it imports."""
    name = error.name or ""
    return name == package or name.startswith(package + ".")


def missing_tensorflow(what: str) -> ImportError:
    return ImportError(f"{what} needs TensorFlow, which is not installed. Install it with: {TF_INSTALL}")


def tensorflow(what: str):
    """The `tensorflow` module, or an ImportError saying that `what` needs it and how to install it."""
    try:
        import tensorflow as tf
    except ModuleNotFoundError as e:
        if not is_missing(e, "tensorflow"):
            raise
        raise missing_tensorflow(what) from e
    return tf


def _extra(module: str, what: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if not is_missing(e, module):
            raise
        raise ImportError(
            f"{what} needs {module}, which is not installed. Install it with: pip install 'ingest[{extra}]'"
        ) from e


def torch():
    """The `torch` module, or an ImportError with the install command (ingest.loader(to='torch'))."""
    return _extra("torch", "ingest.loader(to='torch')", "torch")


def jax():
    """The `jax` module, or an ImportError with the install command (ingest.loader(to='jax'))."""
    return _extra("jax", "ingest.loader(to='jax')", "jax")
