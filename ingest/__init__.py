"""ingest: fast tf.data input pipelines over datasets converted by `beam_jobs`.

    import ingest
    ds = ingest.make_dataset("gs://bucket/dataset", batch_size=256)
    model.fit(ds)

TensorFlow is an extra (`pip install 'ingest[tf]'`): the parts that need it load on first
use, so `import ingest` and `ingest.contract` work on Beam workers without it, and a name
that needs it raises ImportError with the install command there.
"""

import importlib
import warnings

from ingest import _optional

__all__ = [
    "make_dataset",
    "distribute",
    "load_info",
    "ReadOptions",
    "ImageOptions",
    "DatasetInfo",
    "FeatureSpec",
    "DatasetNotFoundError",
    "DatasetInfoError",
    "skipped_corrupt_records",
    "measure_idle",
    "measure_train_step",
    "batch_time_ms",
    "IdleReport",
    "diagnose",
    "feature_space",
    "Statistics",
    "FeatureStatistics",
    "FitStart",
    "StopAtStep",
    "spans",
    "compare",
    "DriftReport",
    "loader",
    "Loader",
    "WorkerError",
    "preprocessing",
    "Preprocessing",
]

_LAZY = {
    "make_dataset": "ingest.pipeline._dataset",
    "skipped_corrupt_records": "ingest.pipeline._read",
    "measure_idle": "ingest.inspection._idle",
    "measure_train_step": "ingest.inspection._idle",
    "batch_time_ms": "ingest.inspection._idle",
    "IdleReport": "ingest.inspection._idle",
    "diagnose": "ingest.inspection._diagnose",
    "feature_space": "ingest.bridges._feature_space",
    "Statistics": "ingest.statistics",
    "FitStart": "ingest.bridges._keras",
    "StopAtStep": "ingest.bridges._keras",
    "FeatureStatistics": "ingest.statistics",
    "distribute": "ingest.bridges._distribute",
    "load_info": "ingest.metadata._info",
    "DatasetNotFoundError": "ingest.metadata._info",
    "DatasetInfoError": "ingest.metadata._info",
    "ReadOptions": "ingest.pipeline._options",
    "ImageOptions": "ingest.pipeline._options",
    "DatasetInfo": "ingest.contract",
    "FeatureSpec": "ingest.contract",
    "spans": "ingest.metadata._spans",
    "compare": "ingest.inspection._compare",
    "DriftReport": "ingest.inspection._compare",
    # Without TensorFlow in this process: the worker processes import it.
    "loader": "ingest.stream",
    "Loader": "ingest.stream",
    "WorkerError": "ingest.stream",
    "preprocessing": "ingest.bridges._preprocessing",
    "Preprocessing": "ingest.bridges._preprocessing",
}

# Old names that still resolve, with a DeprecationWarning on each use: old name -> new name.
# PipelineOptions clashed with Beam's PipelineOptions, which the conversion imports too.
_DEPRECATED = {"PipelineOptions": "ReadOptions"}


def __getattr__(name):
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(
            f"ingest.{name} is deprecated: use ingest.{new}, the same class under a new name",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(new)
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as e:
            if _optional.is_missing(e, "tensorflow"):
                raise _optional.missing_tensorflow(f"ingest.{name}") from e
            raise
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
