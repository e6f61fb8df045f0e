"""The seekable order's stream spread over worker processes, and `ingest.loader` on top of it.

    trainer process                                 worker process k of K (started once)
    ---------------                                 ------------------------------------
    loader(path, to="torch")                        forked from the template process
                                                    (python -m ingest.stream._template,
                                                    TensorFlow imported once for all K)
      Stream --spec (make_dataset's keywords)-->      builds the seekable order once, for
             <--ready (window rows, columns)---       windows w with w % K == k (TensorFlow
                                                      imported here, pinned to its cores)
      per pass: --iterate (pass, first batch)-->      a new iterator over that graph
             <--window w (slot, layout)---------      window w's rows, permuted, written
      window w read in place from worker w % K's      into a free slot of shared memory
      slot, cut into batches, each copied once        (memfd: nothing named in /dev/shm)
      into the framework's memory by a feeder
      thread; --free (slot)--> when done

One tf.data runtime's threads contend past ~8 cores (5.4M rows/s on 8 vCPUs of an H100
host, 6.7M on 16); processes do not. Window w comes from worker w % K and every window
holds whole batches, so the batches are the same for any K (and the same as
`make_dataset`'s, whose order this is): the consumer restores the order by reading the
workers in turn. A pass starts at any batch: the position (pass, batch) is the resume
state. A worker that fails sends its error; one that dies closes its socket and the
consumer raises at once, naming it; workers end with the loader, at exit, or, if the
trainer is killed, by their own check of their parent.

Every loader of a process forks from the same template, which ends 30 s after its last
worker (`_workers._IDLE_S`): a later loader pays no TensorFlow import.

Memory: each worker is a TensorFlow process (~320 MB before data, here, the imported
modules' pages shared with the template until written) holding
`slots` windows in shared memory (2) and its tf.data buffers (`window_calls` windows
being parsed, one prefetched): about K x (320 MB + (slots + window_calls + 1) x window
bytes), a window >= 81,920 rows. Measured (PSS of all processes, 500k-row numeric
corpus): 880 MB in one process, 908 MB with 1 worker, 1,227 MB with 2.

A TensorFlow trainer can take the same stream as a `tf.data.Dataset` (`_tf_feed`: a
window a Python call, batches cut in the runtime). It is not `make_dataset`'s default:
on 2 cores the workers and the trainer's runtime share the cores and it reads below
`make_dataset` in one process; the GPU host's probe (`benchmarks/device_probe.py proc`)
measures it on 16.

May import: `ingest.pipeline` (the workers build its seekable order), `ingest.metadata`
and below; not `ingest.bridges` beside it, nor the face (`ingest.__init__`). The consumer
side (`_loader`, `_stream`, `_workers`) imports no TensorFlow: only the workers do, and
`_tf_feed`, which is for a trainer that has it.
"""

from ingest.stream._loader import Loader, loader
from ingest.stream._stream import Stream
from ingest.stream._workers import WorkerError

__all__ = ["Loader", "Stream", "WorkerError", "loader"]
