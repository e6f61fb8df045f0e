"""The in-process runner the job uses on the embedded default, and its per-bundle latency.

Beam's DirectRunner first tries PrismRunner, which downloads a binary at run time (and
fails offline, after a network attempt on every run) before falling back to the
FnApiRunner; `runner` gives the FnApiRunner directly (it honours --direct_running_mode
and --direct_num_workers).

Every bundle the FnApiRunner runs starts a state-sampler thread that sleeps between
samples, ramping up to 200 ms, and the bundle's end joins it: up to 200 ms of idle
latency per bundle, a fixed cost Beam accepts for long-running workers (apache/beam#5466
added the ramp for the same reason). A conversion runs ~9 bundles, so
`short_state_sampling` caps the sleep while the job runs here: measured on the 500k-row
CSV, the joins took 0.22-0.25 s of a 2.6 s job, and 0.02-0.03 s with the cap.
"""

from __future__ import annotations

import contextlib

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

__all__ = ["runner", "short_state_sampling", "SAMPLING_PERIOD_MS"]

SAMPLING_PERIOD_MS = 10


def runner(options: PipelineOptions):
    """The in-process runner for the default and DirectRunner cases; None lets Beam choose."""
    name = options.view_as(StandardOptions).runner
    if name not in (None, "DirectRunner", "direct", "SwitchingDirectRunner"):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


@contextlib.contextmanager
def short_state_sampling():
    """Bundles run in this process sample their state every SAMPLING_PERIOD_MS at most.

    Beam gives no option for the period: this sets the default of the sampler's
    constructor, and leaves it as it was if Beam's signature is not the one it knows.
    """
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    before = init.__defaults__
    if before != (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        yield
        return
    init.__defaults__ = (min(SAMPLING_PERIOD_MS, before[0]),)
    try:
        yield
    finally:
        init.__defaults__ = before
