"""Converts CSV, Parquet or image corpora into sharded TFRecord datasets of tf.train.Example.

    python -m beam_jobs.convert --source csv --input 'data/*.csv' --output out/ds \\
        [--label y] [--splits train=0.8,eval=0.2] [any Beam pipeline option]
    python -m beam_jobs.convert --source images --input photos/ --output out/img  # photos/<label>/<file>
    python -m beam_jobs.convert --source images --input manifest.csv --output out/img  # path,label,...

Runs on Beam's DirectRunner by default; `--runner DataflowRunner ...` runs it on Dataflow.
Flags follow Beam's spelling (`--num_shards`); dashed forms (`--num-shards`) work too.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions

from beam_jobs import _in_process
from beam_jobs._config import JobConfig, layout_for
from beam_jobs._errors import ConversionError
from beam_jobs._job_options import JobOptions
from beam_jobs._pipeline import ConvertToTFRecords
from beam_jobs.output import directory as output_dir
from beam_jobs.sources import ADAPTER_FOR_FORMAT, carried_schema
from beam_jobs.sources.base import flag
from ingest import contract
from ingest.names import did_you_mean

__all__ = ["main", "run", "build_parser", "refuse_unknown_flags", "ConversionError"]

logger = logging.getLogger("beam_jobs.convert")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m beam_jobs.convert",
        description="Convert CSV, Parquet or image files into sharded TFRecords of tf.train.Example "
        "with a metadata file the ingest runtime reads. Other flags must be Beam pipeline options "
        "(--runner, --direct_running_mode, --project, ...).",
    )
    JobOptions.add_flags(p, flag, choices={"source": tuple(sorted(ADAPTER_FOR_FORMAT))})
    p.add_argument("--verbose", "-v", action="store_true", help="log at DEBUG, with the runner's tracebacks")
    for name, adapter in ADAPTER_FOR_FORMAT.items():
        adapter.add_flags(p.add_argument_group(f"{name} (--source {name})"))
    return p


def _check_source_flags(parser: argparse.ArgumentParser, args) -> None:
    """Refuses a flag of another source that was given (it would be ignored)."""
    for group in parser._action_groups:
        name = group.title.split(" ", 1)[0]
        if name not in ADAPTER_FOR_FORMAT or name == args.source:
            continue
        for action in group._group_actions:
            if getattr(args, action.dest) != action.default:
                raise ConversionError(
                    f"{action.option_strings[0]} applies to --source {name}, not --source {args.source}"
                )


def make_config(args, pipeline_options: PipelineOptions | None = None) -> JobConfig:
    """Checks every flag, opens the input with its source adapter, plans the output."""
    _check_source_flags(build_parser(), args)
    opts = JobOptions.from_args(args)
    adapter = ADAPTER_FOR_FORMAT[opts.source]
    adapter.check_flags(args)
    layout_for(opts, adapter)
    schema = carried_schema.of_options(opts)  # read before the input is listed: a bad one fails first
    source = adapter.open(args)
    if schema is not None:
        source = source.carrying(schema, selected=opts.columns is not None)
    if opts.split_key and opts.split_key not in source.columns:
        raise ConversionError(
            f"--split_key {opts.split_key!r}{did_you_mean(opts.split_key, source.columns)} is not a feature of "
            f"the records; features: {list(source.columns)}"
        )
    label = source.fixed_label or (schema.label if schema is not None else opts.label)
    return JobConfig.of(opts, source, tmp_dir=opts.claim_output(), label=label)


def build_pipeline(cfg: JobConfig, options: PipelineOptions) -> beam.Pipeline:
    p = beam.Pipeline(runner=_in_process.runner(options), options=options)
    _ = (
        p
        | "ListInputs" >> beam.Create(cfg.source.work_items())
        # (file index, path, None), or (item index, (ImageEntry, ...), None) for images
        | "Convert" >> ConvertToTFRecords(cfg)
    )
    return p


def pipeline_options(beam_args: list) -> PipelineOptions:
    """Beam's options for the job from its Beam flags; pipeline type checking off unless asked.

    Beam checks type hints as each transform is applied: 0.03 s of a 0.2 s run on a
    100-row input (0.196 against 0.226 s, median of 12), a fixed cost of every run (the
    job's transforms are fixed and tested). --pipeline_type_check turns it back on.
    """
    options = PipelineOptions(beam_args)
    if "--pipeline_type_check" not in beam_args:
        options.view_as(TypeOptions).pipeline_type_check = False
    return options


def refuse_unknown_flags(beam_args: list, parser: argparse.ArgumentParser) -> None:
    """Refuses what is neither the job's flag nor a Beam pipeline option. Beam only logs
    'Unparseable argument' for it, so a misspelt flag (--lable y) ran without its effect."""
    beam_parsers = []  # Beam's own parser of every pipeline option, as PipelineOptions builds it
    PipelineOptions(beam_args).get_all_options(add_extra_args_fn=beam_parsers.append)
    _, unknown = beam_parsers[0].parse_known_args(beam_args)
    if not unknown:
        return
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if not flags:
        raise ConversionError(f"unexpected argument {unknown[0]!r}: every value follows its flag (see --help)")
    known = [o for p in (parser, beam_parsers[0]) for a in p._actions for o in a.option_strings]
    raise ConversionError(
        f"unknown flag {flags[0]}{did_you_mean(flags[0], known, quote=str)}: it is neither a "
        "flag of python -m beam_jobs.convert (see --help) nor a Beam pipeline option"
    )


def run(argv=None) -> contract.DatasetInfo | None:
    """Runs a conversion; returns the written metadata, or None if the runner did not run it here."""
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    refuse_unknown_flags(beam_args, parser)
    options = pipeline_options(beam_args)
    # Launch-time listing and checks use the same filesystem options (credentials, --no_auth) as the job.
    FileSystems.set_options(options)
    cfg = make_config(args, options)
    logger.info(
        "converting %d %s (%.1f MB) into %s: columns %s, splits %s, shards %s",
        cfg.source.input_count,
        "images" if cfg.source.unit == "image" else f"{cfg.source_format} file(s)",
        cfg.source.input_bytes / 2**20,
        cfg.output,
        list(cfg.columns),
        dict(cfg.splits),
        list(cfg.shard_counts(None)),
    )
    start = time.perf_counter()
    try:
        with _in_process.short_state_sampling():
            result = build_pipeline(cfg, options).run()
            result.wait_until_finish()
    finally:
        # A job that stopped without committing (failed, or a dry run) gives up its claim
        # on the directory; the temp dir (with the quarantine that explains a failure)
        # is kept until the next run cleans it up.
        output_dir.release(cfg.tmp_dir)
    elapsed = time.perf_counter() - start
    metadata = FileSystems.join(cfg.output, contract.METADATA_FILENAME)
    if not FileSystems.exists(metadata):
        return None  # e.g. Dataflow with --dry_run: nothing was executed
    with FileSystems.open(metadata) as f:
        info = contract.DatasetInfo.from_json(f.read().decode("utf-8"))
    print(summary_table(info, elapsed))
    return info


def summary_table(info: contract.DatasetInfo, elapsed: float) -> str:
    rows = info.source.get("rows", 0)
    unit = "images" if info.image else "rows"
    lines = ["| split | records | shards | MB |", "|---|---:|---:|---:|"]
    for s in info.splits:
        lines.append(f"| {s.name} | {s.records} | {len(s.shards)} | {s.bytes / 2**20:.1f} |")
    lines.append("")
    lines.append(f"label: {info.label or 'none'}")
    lines.append(
        f"{rows} {unit} read, {info.quarantine.get('records', 0)} quarantined"
        f" ({', '.join(f'{k}: {v}' for k, v in info.quarantine.get('reasons', {}).items()) or 'none'}),"
        f" {elapsed:.1f} s, {rows / max(elapsed, 1e-9):,.0f} {unit}/s"
    )
    return "\n".join(lines)


class _ReportedOnce(logging.Filter):
    """Beam logs a failed step's exception, traceback and all, before raising it to
    `main`, which prints it as one line: without --verbose those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apache_beam") and record.levelno >= logging.ERROR)


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("beam_jobs").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_ReportedOnce())


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _configure_logging(verbose=bool({"--verbose", "-v"} & set(argv)))
    try:
        run(argv)
    except KeyboardInterrupt:
        print("error: interrupted; no dataset was written (rerun to start over)", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback at DEBUG (--verbose)
        logger.debug("conversion failed", exc_info=True)
        print(f"error: {_innermost_message(e)}", file=sys.stderr)
        return 1
    return 0


def _innermost_message(e: BaseException) -> str:
    """The message of the error a worker raised, without the runner's wrapping."""
    text = str(e)
    for marker in ("ConversionError: ", "ValueError: ", "OSError: ", "TFRecordError: "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
            break
    text = text.split(" [while running")[0].strip()
    return text.splitlines()[0] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
