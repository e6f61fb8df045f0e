"""`WriteDataset`: the conversion's writing half as a public Beam transform.

    rows | beam_jobs.WriteDataset("gs://bucket/ds", label="y", splits={"train": 0.9, "eval": 0.1})

`rows` is a PCollection of dicts (what `ReadFromBigQuery` yields, or any ParDo), of
`beam.Row`s, or of `pyarrow.RecordBatch`es. The dataset is the one
`python -m beam_jobs.convert` writes: shards, `dataset_info.json` written last, a
quarantine for rows whose values do not fit the column types (`beam_jobs.sources.rows`
says how types are decided), and the same rules for the output directory.
"""

from __future__ import annotations

import inspect
import random
import weakref

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs._config import JobConfig
from beam_jobs._errors import ConversionError
from beam_jobs._job_options import JobOptions, new_job_id
from beam_jobs._pipeline import ConvertToTFRecords
from beam_jobs.output import directory as output_dir
from beam_jobs.sources import carried_schema
from beam_jobs.sources.rows import RowsSource, carried

__all__ = ["WriteDataset"]

# The outputs each pipeline's WriteDatasets write into (two into one are refused at build).
_OUTPUTS_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _claim(_, opts: JobOptions, job_id: str) -> str:
    return opts.claim_output(running_here=False, job_id=job_id)


class _ToWorkItems(beam.DoFn):
    """dict | beam.Row | RecordBatch | Table -> (item index, [dict] | RecordBatch, None).

    Dict rows are gathered into lists of up to `batch_rows`; Arrow data passes as it is.
    The item index, random, only spreads items over shards.
    """

    def __init__(self, batch_rows: int):
        self._batch_rows = batch_rows

    def start_bundle(self):
        self._rows = []

    def process(self, element, claimed=None):
        # `claimed` (the temp dir) is there to order the steps: no row before the claim.
        if isinstance(element, pa.Table):
            for batch in element.to_batches():
                yield self._item(batch)
        elif isinstance(element, pa.RecordBatch):
            yield self._item(element)
        else:
            self._rows.append(element._asdict() if hasattr(element, "_asdict") else dict(element))
            if len(self._rows) >= self._batch_rows:
                yield self._item(self._rows)
                self._rows = []

    def finish_bundle(self):
        if self._rows:
            yield WindowedValue(self._item(self._rows), MIN_TIMESTAMP, [GlobalWindow()])
            self._rows = []

    @staticmethod
    def _item(payload):
        # A str UTF-8 cannot hold, wrapped: Beam's coders would fail the pipeline on it.
        return (random.getrandbits(31), payload if isinstance(payload, pa.RecordBatch) else carried(payload), None)


class WriteDataset(beam.PTransform):
    """Writes a PCollection of rows as a dataset `ingest.make_dataset` reads.

    The output is claimed when the pipeline runs (a pipeline built and not run leaves
    nothing). Rows of any windowing are written as one dataset (re-windowed into the
    global window). One WriteDataset per output directory in a pipeline.

    Args:
      output: dataset directory, local or gs://; empty, or holding a dataset this job
        may replace (`overwrite`).
      batch_rows: dict rows are gathered into lists of this many before conversion.
      **options: the CLI's flags as keywords, declared once in `JobOptions`, each with
        its flag's default (`columns` a list, `splits` a dict or "train=0.9,eval=0.1"):
        `help(WriteDataset)` lists them, made from that declaration, as do the docs'
        table of flags.

    Returns:
      The metadata's JSON text, once written.
    """

    def __init__(self, output: str, *, batch_rows: int = 4096, **options):
        super().__init__()
        # The same checks as the CLI's flags, at construction: a bad value fails before the pipeline runs.
        self._opts = JobOptions.of_keywords(output, **options)
        # Read now, as the CLI reads it at launch: a missing schema fails before the pipeline runs.
        self._schema = carried_schema.of_options(self._opts)
        self._batch_rows = batch_rows

    def expand(self, rows):
        opts = self._opts
        writers = _OUTPUTS_OF.setdefault(rows.pipeline, set())
        if opts.output in writers:
            raise ConversionError(
                f"this pipeline already has a WriteDataset into {opts.output}: each would take the other's temp "
                "dir for a dead job's; give each WriteDataset an output of its own"
            )
        writers.add(opts.output)
        # The output is claimed when the pipeline runs, before any row is written (as Beam's
        # FileBasedSink.initialize_write): a pipeline built and never run leaves nothing.
        # A pipeline that fails leaves its temp dir for the next run to clean up.
        job_id = new_job_id()
        claimed = rows.pipeline | "ClaimOutput" >> beam.Impulse() | beam.Map(_claim, opts, job_id)
        tmp_dir = output_dir.temp_dir_of(opts.output, job_id)
        source = RowsSource(
            input_pattern=f"{self.label} input",
            columns=opts.columns or (),
            input_bytes=0,
            input_count=0,
            schema_origin="inferred" if self._schema is None else "carried",
            schema=self._schema,
            name=self.label,
        )
        label = opts.label if self._schema is None else self._schema.label
        cfg = JobConfig.of(opts, source, tmp_dir=tmp_dir, label=label)
        return (
            rows
            # Rows of any windowing are one dataset; batches are cut across windows.
            | "GlobalWindow" >> beam.WindowInto(beam.window.GlobalWindows())
            | "WorkItems" >> beam.ParDo(_ToWorkItems(self._batch_rows), beam.pvalue.AsSingleton(claimed))
            # (item index, [dict] | RecordBatch, None)
            | "Convert" >> ConvertToTFRecords(cfg)
        )


def _signature() -> inspect.Signature:
    """WriteDataset's signature as help() and IDEs show it: output, batch_rows and every keyword option."""
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("output", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
        inspect.Parameter("batch_rows", inspect.Parameter.KEYWORD_ONLY, default=4096, annotation=int),
    ]
    params += [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in JobOptions.keywords().items()
    ]
    return inspect.Signature(params)


WriteDataset.__init__.__signature__ = _signature()
# The keyword options, from their declaration: the docstring's Other Parameters section.
WriteDataset.__doc__ += "\n    Other Parameters:\n" + "\n".join(
    f"      {name}: {JobOptions.declared(name).metadata['help']}".replace("%%", "%") for name in JobOptions.keywords()
)
