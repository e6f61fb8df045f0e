"""tf.data service servers as long-running processes: `ingest service dispatcher|worker`.

A dispatcher hands out work; workers run the input pipelines and stream batches to
trainers, which connect with `make_dataset(..., service="grpc://dispatcher:port")`.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import time

import tensorflow as tf

__all__ = ["run_dispatcher", "run_worker", "PROCESSING_MODES", "DEFAULT_TIMEOUT_S", "guard_stalls"]

logger = logging.getLogger(__name__)

PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
# How long a consumer waits for a batch before it declares the service stalled. A dispatcher
# notices a dead worker only after its worker timeout (TF's default: a minute or more; 30 s
# heartbeats), so TensorFlow's own recovery, when it happens, is not cut short by much.
DEFAULT_TIMEOUT_S = 60.0
# Batches read ahead of the consumer from the service; the trainer's prefetch comes on top.
_AHEAD = 2
_POLL_S = 0.5  # how often a blocked reader checks whether its consumer went away


def guard_stalls(
    ds: tf.data.Dataset, *, dispatcher: str, timeout_s: float, expected_records: int | None = None
) -> tf.data.Dataset:
    """`ds`, a dataset read from the tf.data service, that raises instead of waiting forever.

    TensorFlow's service client can wait forever for a worker killed mid-epoch (TF 2.21:
    the consumer stalled in 4 of 5 runs of tests/repro_service_worker_kill.py), and its
    GetNext cannot be interrupted. So each iteration reads `ds` in a daemon thread into a
    small queue, and the dataset returned takes batches from the queue: when none comes
    for `timeout_s` while the consumer waits, it raises an error naming the dispatcher
    (tf.errors.UnavailableError, which reaches the consumer as an OpError). The reader
    thread stays blocked in TensorFlow until the process exits. Elements are whole
    batches, so the Python hand-off costs little per record.

    `expected_records`: when every record of the run is known to come exactly once
    (distributed_epoch), a stall after all of them arrived ends the run normally: the
    lost worker had nothing left to send.
    """

    def batches():
        ahead = queue.Queue(maxsize=_AHEAD)
        gone = threading.Event()
        threading.Thread(
            target=_read_into, args=(ds, ahead, gone), daemon=True, name=f"tf.data service reader ({dispatcher})"
        ).start()
        delivered = 0
        try:
            while True:
                try:
                    kind, value = ahead.get(timeout=timeout_s)
                except queue.Empty:
                    if expected_records is not None and delivered >= expected_records:
                        logger.warning(
                            "the tf.data service at %s stalled after delivering all %d records (a worker "
                            "was most likely lost): ending the run",
                            dispatcher,
                            delivered,
                        )
                        return
                    raise tf.errors.UnavailableError(
                        None,
                        None,
                        f"the tf.data service at {dispatcher} delivered no batch for {timeout_s:g} s: a worker "
                        "was most likely lost mid-epoch (killed, crashed or unreachable), and TensorFlow's "
                        "service client does not recover from that reliably. Records of this epoch may be "
                        "missing: check the workers and iterate the dataset again for a new epoch. If a batch "
                        "can legitimately take longer, raise ReadOptions(service_timeout_s=...).",
                    ) from None
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                delivered += _batch_size(value)
                yield value
        finally:
            gone.set()

    return tf.data.Dataset.from_generator(batches, output_signature=ds.element_spec)


def _batch_size(batch) -> int:
    first = tf.nest.flatten(batch)[0]  # a RaggedTensor stays whole: its first dimension is the batch
    return int(first.shape[0]) if first.shape.rank else 1


def _read_into(ds, ahead: queue.Queue, gone: threading.Event) -> None:
    def put(item) -> bool:
        while not gone.is_set():
            try:
                ahead.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    try:
        for batch in ds:
            if not put(("batch", batch)):
                return
        put(("end", None))
    except Exception as e:  # noqa: BLE001  (handed to the consumer, which raises it)
        put(("error", e))


def _strip_protocol(address: str) -> str:
    return address.split("://", 1)[1] if "://" in address else address


def _serve_until_stopped(server, what: str) -> None:
    # SIGTERM (Kubernetes, systemd) stops the server cleanly instead of killing mid-RPC.
    # The servers run on their own threads; the main thread waits in Python, not in
    # server.join(), so that the signal handler gets to run.
    def stop(*_):
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"{what} serving", flush=True)
    while True:
        time.sleep(3600)


def run_dispatcher(
    *, port: int, work_dir: str | None = None, fault_tolerant: bool = False, worker_timeout_ms: int | None = None
) -> None:
    """Runs a dispatcher on `port` until the process is stopped."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port,
        work_dir=work_dir,
        fault_tolerant_mode=fault_tolerant,
        **({"worker_timeout_ms": worker_timeout_ms} if worker_timeout_ms else {}),
    )
    server = tf.data.experimental.service.DispatchServer(config)
    _serve_until_stopped(server, f"tf.data service dispatcher at {server.target}")


def run_worker(
    *, dispatcher: str, port: int = 0, worker_address: str | None = None, heartbeat_interval_ms: int | None = None
) -> None:
    """Runs a worker registered with `dispatcher` ("host:port" or "grpc://host:port").

    Its heartbeat interval must stay well under the dispatcher's worker timeout, or live
    workers are declared dead between heartbeats.
    """
    extra = {}
    if worker_address:
        extra["worker_address"] = worker_address
    if heartbeat_interval_ms:
        extra["heartbeat_interval_ms"] = heartbeat_interval_ms
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=_strip_protocol(dispatcher), port=port, **extra
    )
    server = tf.data.experimental.service.WorkerServer(config)
    _serve_until_stopped(server, f"tf.data service worker (port {port or 'any'}) for dispatcher {dispatcher}")
