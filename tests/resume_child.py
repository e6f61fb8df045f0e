"""Restores make_dataset iterators from checkpoints in a fresh process; prints the next batches' ids.

    python tests/resume_child.py SPEC_JSON

SPEC: {"path", "kwargs" (make_dataset keywords, "input_context": [n, i]), "checkpoints"
(prefixes), "batches"}. Prints one JSON line: a list per checkpoint of the `id` column of
each batch that follows it.
"""

import json
import sys

import tensorflow as tf

import ingest


def main(spec):
    kwargs = dict(spec["kwargs"])
    if "input_context" in kwargs:
        n, i = kwargs.pop("input_context")
        kwargs["input_context"] = tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i)
    out = []
    for prefix in spec["checkpoints"]:
        it = iter(ingest.make_dataset(spec["path"], **kwargs))
        tf.train.Checkpoint(iterator=it).read(prefix).assert_consumed()
        batches = []
        for _ in range(spec["batches"]):
            try:
                batch = next(it)
            except StopIteration:
                break
            features = batch[0] if isinstance(batch, tuple) else batch
            batches.append(features["id"].numpy().tolist())
        out.append(batches)
    print(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
