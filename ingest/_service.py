"""tf.data service servers as long-running processes: `ingest service dispatcher|worker`.

A dispatcher hands out work; workers run the input pipelines and stream batches to
trainers, which connect with `make_dataset(..., service="grpc://dispatcher:port")`.
"""

from __future__ import annotations

import logging
import signal
import sys
import time

import tensorflow as tf

__all__ = ["run_dispatcher", "run_worker", "PROCESSING_MODES"]

logger = logging.getLogger(__name__)

PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")


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


def run_dispatcher(*, port: int, work_dir: str | None = None, fault_tolerant: bool = False,
                   worker_timeout_ms: int | None = None) -> None:
    """Runs a dispatcher on `port` until the process is stopped."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=fault_tolerant,
        **({"worker_timeout_ms": worker_timeout_ms} if worker_timeout_ms else {}),
    )
    server = tf.data.experimental.service.DispatchServer(config)
    _serve_until_stopped(server, f"tf.data service dispatcher at {server.target}")


def run_worker(*, dispatcher: str, port: int = 0, worker_address: str | None = None,
               heartbeat_interval_ms: int | None = None) -> None:
    """Runs a worker registered with `dispatcher` ("host:port" or "grpc://host:port").

    Its heartbeat interval must stay well under the dispatcher's worker timeout, or live
    workers are declared dead between heartbeats.
    """
    extra = {}
    if worker_address:
        extra["worker_address"] = worker_address
    if heartbeat_interval_ms:
        extra["heartbeat_interval_ms"] = heartbeat_interval_ms
    config = tf.data.experimental.service.WorkerConfig(dispatcher_address=_strip_protocol(dispatcher), port=port, **extra)
    server = tf.data.experimental.service.WorkerServer(config)
    _serve_until_stopped(server, f"tf.data service worker (port {port or 'any'}) for dispatcher {dispatcher}")
