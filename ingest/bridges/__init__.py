"""Where the pipeline meets a framework: Keras, tf.distribute, non-Keras preprocessing.

    recorded statistics --_feature_space--> a Keras FeatureSpace (_space_layer: its
                                            missing-value layer), and its summary table
    recorded statistics --_preprocessing--> numpy and torch functions (no Keras)
    Keras' fit ----------------_keras-----> FitStart, StopAtStep: resume mid-epoch
    tf.distribute -------------_distribute-> one input pipeline per worker, files sharded

`ingest.stream` (`ingest.loader` for PyTorch, JAX and numpy) sits on this floor too, a
package of its own: it runs the pipeline in worker processes.

May import: `ingest.inspection` (its tables), `ingest.pipeline`, `ingest.metadata` and
below. Nothing in the floors below imports a bridge.
"""
