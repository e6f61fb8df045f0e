"""The tf.data graph of one `make_dataset` call, from the recorded dataset to batches.

    make_dataset(path, ...) (_dataset)
      -> Request: every argument checked, the metadata's facts gathered once
         (_request, through ingest.metadata._facts)
      -> read: shards -> records, checked against the metadata (_read, _tuning)
         or blocks/: the block index, the seekable order, the streaming order, the
         column cache, canonical partitions (blocks/)
      -> parse: records -> columns, images decoded (_parse, _image_decode)
      -> the finish: preprocess, prefetch, tf.data options (_options), the tf.data
         service (_service), iterators that checkpoint their position (_restore)

`_functions` traces this package's tf.data functions without AutoGraph or Grappler;
`_system` holds the machine facts (memory, usable cores) the sizes come from.

May import: `ingest.metadata` and the modules it may. Not inspection, bridges or the
stream, which build on it.
"""
