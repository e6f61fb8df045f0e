"""Looking at a dataset and at how fast it feeds: what `ingest describe|compare|diagnose` run.

    DatasetInfo, statistics --_describe--> a table per feature
    two datasets' statistics --_compare--> DriftReport (skew, drift, schema changes)
    make_dataset's graph ------_diagnose-> where the time goes, the fix ranked
    a dataset and a step ------_idle-----> IdleReport: how long the accelerator waits

May import: `ingest.pipeline` (diagnose builds graphs), `ingest.metadata` and below.
Not the bridges, which may show inspection's tables.
"""
