"""ingest: fast tf.data input pipelines over datasets converted by `beam_jobs`.

    import ingest
    ds = ingest.make_dataset("gs://bucket/dataset", batch_size=256)
    model.fit(ds)

The TensorFlow-dependent parts load on first use, so `ingest.contract` stays importable
by Beam workers without TensorFlow.
"""

import importlib

__all__ = [
    "make_dataset",
    "distribute",
    "load_info",
    "PipelineOptions",
    "DatasetInfo",
    "FeatureSpec",
    "DatasetNotFoundError",
    "DatasetInfoError",
    "skipped_corrupt_records",
    "measure_idle",
    "measure_train_step",
    "IdleReport",
    "diagnose",
]

_LAZY = {
    "make_dataset": "ingest._dataset",
    "skipped_corrupt_records": "ingest._dataset",
    "measure_idle": "ingest._idle",
    "measure_train_step": "ingest._idle",
    "IdleReport": "ingest._idle",
    "diagnose": "ingest._diagnose",
    "distribute": "ingest._distribute",
    "load_info": "ingest._info",
    "DatasetNotFoundError": "ingest._info",
    "DatasetInfoError": "ingest._info",
    "PipelineOptions": "ingest._options",
    "DatasetInfo": "ingest.contract",
    "FeatureSpec": "ingest.contract",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
