"""The dataset as recorded: its metadata read, spans merged, files listed. No TensorFlow.

    dataset_info.json, vocabularies/ --_info--> DatasetInfo (ingest.contract), vocabularies
    span directories, globs, lists ---_spans--> one view of several datasets (Spans)
    local paths: the standard library; gs://, s3://: TensorFlow's filesystems (_files)
    one make_dataset call's path and words --_facts--> Facts: split, label, features, ids

Beside it at `ingest/`'s top, shared with the conversion (`beam_jobs` imports them):
`contract` (the metadata's format), `statistics` (its statistics) and `names` (did you mean).

May import: those three and `ingest._optional`. Nothing above it: the pipeline, inspection
and bridges read the recorded dataset through here, never the other way.
"""
