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
import concurrent.futures
import dataclasses
import logging
import sys
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_jobs import _csv_ranges, _image_inputs, _images, _output, _plan, _sources, _typing
from beam_jobs._config import JobConfig
from beam_jobs._errors import ConversionError
from beam_jobs._pipeline import ConvertToTFRecords
from ingest import contract

__all__ = ["main", "run", "build_parser", "ConversionError"]

logger = logging.getLogger("beam_jobs.convert")


def _flag(parser, name, **kwargs):
    dashed = "--" + name.replace("_", "-")
    names = ["--" + name] + ([dashed] if dashed != "--" + name else [])
    parser.add_argument(*names, dest=name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m beam_jobs.convert",
        description="Convert CSV, Parquet or image files into sharded TFRecords of tf.train.Example "
        "with a metadata file the ingest runtime reads. Unknown flags are Beam pipeline options "
        "(--runner, --direct_running_mode, --project, ...).",
    )
    _flag(p, "source", required=True, choices=["csv", "parquet", "images"], help="input format")
    _flag(p, "input", required=True, help="file pattern, local or gs:// (e.g. 'data/*.csv', 'gs://b/x-*.parquet'); "
          "for images: a folder ROOT/<label>/<file>, or a manifest .csv/.parquet")
    _flag(p, "output", required=True, help="dataset directory, local or gs://")
    _flag(p, "columns", help="comma-separated columns to keep, in this order (default: all)")
    _flag(p, "label", help="the label column (image manifests: default 'label')")
    _flag(p, "column", action="append", default=[], metavar="NAME:TYPE", help="column type: int64, float32 or string (repeatable)")
    _flag(p, "schema", help="JSON file mapping column names to types")
    _flag(p, "delimiter", default=",", help="CSV field delimiter")
    _flag(p, "csv_split_mb", type=float, default=_csv_ranges.DEFAULT_SPLIT_MB,
          help="read CSV files larger than this as byte ranges in parallel (0: always whole); with "
          "--allow_quoted_newlines, files with newlines inside quoted fields are detected and read whole")
    p.add_argument("--allow_quoted_newlines", "--allow-quoted-newlines", dest="allow_quoted_newlines", action="store_true",
                   help="let quoted CSV fields span lines (default: a line whose quote does not close on it is "
                   "quarantined as unterminated_quote, and the next line is read as a row)")
    _flag(p, "null_values", default=",".join(v for v in _sources.DEFAULT_NULL_VALUES if v), help="comma-separated markers read as missing values; empty cells are always missing")
    _flag(p, "splits", help="NAME=FRACTION,... (default: everything in 'train')")
    _flag(p, "split_key", help="column whose value decides the split (default: the record content)")
    _flag(p, "num_shards", type=int, help="shards per split (default: planned from the input size)")
    _flag(p, "target_shard_mb", type=float, default=_plan.DEFAULT_TARGET_SHARD_MB, help="target shard size when planning")
    _flag(p, "compression", default="none", choices=["none", "gzip"])
    _flag(p, "max_bad_fraction", type=float, default=0.001, help="fail when more rows than this are quarantined")
    _flag(p, "seed", type=int, default=0, help="seed of the record shuffle")
    p.add_argument("--shuffle", dest="shuffle", action="store_true", default=True, help="shuffle records across shards (default)")
    p.add_argument("--no_shuffle", "--no-shuffle", "--noshuffle", dest="shuffle", action="store_false", help="keep source order within each shard")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in --output (the old one stays "
                   "readable until the new metadata is written)")
    _flag(p, "stale_job_hours", type=float, default=_output.DEFAULT_STALE_HOURS,
          help="a temp dir of a job started on another machine counts as abandoned after this many hours")
    p.add_argument("--verbose", "-v", action="store_true", help="log at DEBUG, with the runner's tracebacks")
    images = p.add_argument_group("images (--source images)")
    _flag(images, "path_column", default="path", help="manifest column holding image paths (relative to the manifest)")
    _flag(images, "max_side", type=int, help="downsize images whose longer side exceeds this many pixels")
    _flag(images, "reencode", choices=["jpeg", "png"], help="re-encode every image (EXIF-oriented, RGB); default: keep the original bytes")
    _flag(images, "quality", type=int, default=90, help="JPEG quality when re-encoding or downsizing JPEGs")
    _flag(images, "max_pixels", type=int, default=_images.DEFAULT_MAX_PIXELS, help="quarantine images with more pixels (decompression bombs)")
    return p


def _match(pattern: str) -> list:
    try:
        results = FileSystems.match([pattern])
    except Exception as e:
        raise ConversionError(f"cannot list --input {pattern}: {e}") from e
    files = sorted((m.path, m.size_in_bytes) for r in results for m in r.metadata_list)
    if not files:
        raise ConversionError(f"no files match --input {pattern}")
    return files


def _first_mismatch(paths, read, what: str, explain=None):
    """Reads `what` of every file; raises naming the first file that disagrees with the first.

    `explain(first, value, first_path)` says how a file differs and what to do, or None
    when it agrees; by default any difference is reported whole.
    """
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        values = list(pool.map(read, paths))
    for path, value in zip(paths, values):
        if explain is not None:
            how = explain(values[0], value, paths[0])
        elif value != values[0]:
            how = f"has {what} {value}, but the first file {paths[0]} has {values[0]}: all files of one input must agree"
        else:
            how = None
        if how:
            raise ConversionError(f"input file {path} {how}")
    return values[0]


def _select(names: list, args) -> list:
    if args.columns:
        selected = [c.strip() for c in args.columns.split(",") if c.strip()]
        unknown = [c for c in selected if c not in names]
        if unknown:
            raise ConversionError(f"--columns names {unknown}, which the input lacks; its columns: {names}")
    else:
        selected = list(names)
    for flag, col in (("--label", args.label), ("--split_key", args.split_key)):
        if col is not None and col not in names:
            raise ConversionError(f"{flag} {col!r} is not a column of the input; its columns: {names}")
        if col is not None and col not in selected:
            selected.append(col)
    return selected


def _image_config(args) -> JobConfig:
    try:
        opts = _images.ImageOptions(max_side=args.max_side, reencode=args.reencode, quality=args.quality, max_pixels=args.max_pixels)
        if _image_inputs.is_manifest(args.input):
            columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
            corpus = _image_inputs.read_manifest(args.input, path_column=args.path_column,
                                                 label_column=args.label or "label", columns=columns)
        else:
            corpus = _image_inputs.list_folder(args.input)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    if args.column or args.schema:
        raise ConversionError("--column and --schema apply to CSV; image records have a fixed schema")
    types = [(name, dtype, ()) for name, dtype in _images.IMAGE_COLUMNS]
    types += [(name, *_typing.arrow_dtype(name, t)) for name, t in corpus.extra_types]
    return JobConfig(
        source_format="images",
        input_pattern=args.input,
        files=(),
        output=args.output.rstrip("/"),
        tmp_dir="",
        columns=tuple(name for name, _, _ in types),
        arrow_types=tuple(types),
        label=_images.LABEL,
        binary_columns=(_images.ENCODED,),
        input_bytes=corpus.input_bytes,
        schema_origin="images",
        input_count=len(corpus.entries),
        images=opts,
        vocabulary=corpus.vocabulary,
        extra_types=corpus.extra_types,
        image_items=tuple(_image_inputs.work_items(corpus)),
    )


def make_config(args, pipeline_options: PipelineOptions | None = None) -> JobConfig:
    if args.source == "images":
        return _with_plan(_image_config(args), args, "images")
    files = _match(args.input)
    paths = [p for p, _ in files]
    input_bytes = sum(s for _, s in files)
    given: dict = {}
    if args.schema:
        with FileSystems.open(args.schema) as f:
            given.update(_typing.load_schema_file(f.read().decode("utf-8"), path=args.schema))
    given.update(_typing.parse_column_flags(args.column))

    csv = _sources.CsvFormat()
    header: tuple = ()
    arrow_types: tuple = ()
    binary: tuple = ()
    if args.source == "csv":
        nulls = tuple(dict.fromkeys([""] + [v for v in args.null_values.split(",")]))
        csv = _sources.CsvFormat(delimiter=args.delimiter, null_values=nulls, allow_quoted_newlines=args.allow_quoted_newlines)
        names = _first_mismatch(paths, lambda p: _sources.read_csv_header(p, csv), "header")
        header = tuple(names)
        unknown = [c for c in given if c not in names]
        if unknown:
            raise ConversionError(f"--column/--schema name {unknown}, which the input lacks; its columns: {names}")
        columns = _select(names, args)
        origin = "given" if all(c in given for c in columns) else ("mixed" if given else "inferred")
        fmt = "csv.gz" if all(p.endswith(".gz") for p in paths) else "csv"
    else:
        if given:
            raise ConversionError("--column and --schema apply to CSV; Parquet files carry their own schema")
        names = list(_sources.read_parquet_schema(paths[0]).names)
        columns = _select(names, args)
        # Every file's whole schema is checked: without --columns, a column that only some
        # files have would otherwise be left out of the records without a word.
        stored = {}  # path -> its columns' types
        first = _first_mismatch(paths, lambda p: stored.setdefault(p, _parquet_types(p, columns)), "columns",
                                lambda first, value, first_path: _schema_difference(first, value, first_path, columns, every=not args.columns))
        arrow_types = tuple((c, *first[c][:2]) for c in columns)
        # Bytes are text only if no file holds them as binary.
        binary = tuple(c for c in columns if any(s[c][2] for s in stored.values()))
        origin = "parquet"
        fmt = "parquet"

    cfg = JobConfig(
        source_format=args.source,
        input_pattern=args.input,
        files=tuple(paths),
        output=args.output.rstrip("/"),
        tmp_dir="",
        columns=tuple(columns),
        header=header,
        csv=csv,
        given_types=tuple(sorted(given.items())),
        arrow_types=arrow_types,
        label=args.label,
        binary_columns=binary,
        input_bytes=input_bytes,
        schema_origin=origin,
        input_count=len(paths),
        file_sizes=tuple(size for _, size in files),
        csv_split_bytes=int(args.csv_split_mb * 2**20) if args.source == "csv" else 0,
    )
    return _with_plan(cfg, args, fmt)


def _with_plan(cfg: JobConfig, args, fmt: str) -> JobConfig:
    """Adds what every source shares: splits, shard counts, output checks, a temp dir."""
    if args.csv_split_mb < 0:
        raise ConversionError(f"--csv_split_mb must be 0 (never split) or positive, got {args.csv_split_mb}")
    if not 0 <= args.max_bad_fraction <= 1:
        raise ConversionError(f"--max_bad_fraction must be in [0, 1], got {args.max_bad_fraction}")
    if args.num_shards is not None and args.num_shards < 1:
        raise ConversionError(f"--num_shards must be at least 1, got {args.num_shards}")
    if not args.stale_job_hours > 0:
        raise ConversionError(f"--stale_job_hours must be positive, got {args.stale_job_hours}")
    try:
        splits = _plan.parse_splits(args.splits)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    if args.split_key is not None and args.split_key not in cfg.columns:
        raise ConversionError(f"--split_key {args.split_key!r} is not a feature of the records; features: {list(cfg.columns)}")
    estimate = _plan.estimate_output_bytes(cfg.input_bytes, fmt)
    if args.num_shards is not None:
        num_shards = tuple(args.num_shards for _ in splits)
    else:
        num_shards = tuple(_plan.plan_num_shards(int(estimate * f), target_shard_mb=args.target_shard_mb) for f in splits.values())
    tmp_dir = _output.claim_output(cfg.output, overwrite=args.overwrite, job_id=uuid.uuid4().hex[:12],
                                   stale_after_s=args.stale_job_hours * 3600)
    return dataclasses.replace(
        cfg,
        tmp_dir=tmp_dir,
        splits=tuple(splits.items()),
        split_key=args.split_key,
        num_shards=num_shards,
        shuffle=args.shuffle,
        seed=args.seed,
        compression=args.compression,
        max_bad_fraction=args.max_bad_fraction,
        overwrite=args.overwrite,
    )


def _parquet_types(path: str, columns: list) -> dict:
    """Each column of a file -> (dtype, shape, holds binary) if it is in `columns`, else None."""
    out = {}
    for field in _sources.read_parquet_schema(path):
        if field.name not in columns:
            out[field.name] = None
            continue
        try:
            dtype, shape = _typing.arrow_dtype(field.name, field.type)
        except ValueError as e:
            raise ValueError(f"input file {path}: {e}") from e
        out[field.name] = (dtype, shape, _is_binary(field.type))
    return out


def _schema_difference(first: dict, value: dict, first_path: str, columns: list, *, every: bool):
    """How one file's columns differ from the first file's, and the fix; None if they agree.

    `every`: all columns must match (no --columns); else only the selected ones.
    """
    extra = [c for c in value if c not in first] if every else []
    missing = [c for c in (first if every else columns) if c not in value]
    if extra or missing:
        shared = ",".join(c for c in first if c in value)
        how = " and ".join(
            [f"has column(s) {extra} that the first file {first_path} lacks"] * bool(extra)
            + [f"lacks column(s) {missing} that the first file {first_path} has"] * bool(missing)
        )
        fix = f"convert the columns they share by listing them, e.g. --columns {shared}" if shared else "they share none: convert them separately"
        return f"{how}: all files of one input must have the same columns; {fix}"
    differ = [c for c in columns if value[c][:2] != first[c][:2]]
    if not differ:
        return None
    this = {c: _describe(*value[c][:2]) for c in differ}
    that = {c: _describe(*first[c][:2]) for c in differ}
    return (f"has column types {this}, but the first file {first_path} has {that}: all files of one input must "
            "agree; leave the column(s) out with --columns, or rewrite the files with one type per column")


def _describe(dtype: str, shape: tuple) -> str:
    if shape == ():
        return dtype
    return f"list of {dtype}" if shape[0] is None else f"{dtype}[{shape[0]}]"


def _is_binary(t) -> bool:
    import pyarrow as pa

    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t)


def _runner(options: PipelineOptions):
    """The in-process runner for the default and DirectRunner cases; None lets Beam choose.

    Beam's DirectRunner first tries PrismRunner, which downloads a binary at run time
    (and fails offline, after a network attempt on every run) before falling back to
    the FnApiRunner. Use that runner directly; it honours --direct_running_mode and
    --direct_num_workers.
    """
    name = options.view_as(StandardOptions).runner
    if name not in (None, "DirectRunner", "direct", "SwitchingDirectRunner"):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


def build_pipeline(cfg: JobConfig, options: PipelineOptions) -> beam.Pipeline:
    p = beam.Pipeline(runner=_runner(options), options=options)
    _ = (
        p
        | "ListInputs" >> beam.Create(list(enumerate(cfg.image_items or cfg.files)))
        # (file index, path), or (item index, (ImageEntry, ...)) for images
        | "Convert" >> ConvertToTFRecords(cfg)
    )
    return p


def run(argv=None) -> contract.DatasetInfo | None:
    """Runs a conversion; returns the written metadata, or None if the runner did not run it here."""
    args, beam_args = build_parser().parse_known_args(argv)
    options = PipelineOptions(beam_args)
    # Launch-time listing and checks use the same filesystem options (credentials, --no_auth) as the job.
    FileSystems.set_options(options)
    cfg = make_config(args, options)
    logger.info(
        "converting %d %s (%.1f MB) into %s: columns %s, splits %s, shards %s",
        cfg.input_count, "images" if cfg.images else f"{cfg.source_format} file(s)", cfg.input_bytes / 2**20, cfg.output,
        list(cfg.columns), dict(cfg.splits), list(cfg.num_shards),
    )
    start = time.perf_counter()
    try:
        result = build_pipeline(cfg, options).run()
        result.wait_until_finish()
    finally:
        # A job that stopped without committing (failed, or a dry run) gives up its claim
        # on the directory; the temp dir (with the quarantine that explains a failure)
        # is kept until the next run cleans it up.
        if FileSystems.exists(FileSystems.join(cfg.tmp_dir, _output.JOB_FILE)):
            _output.release(cfg.tmp_dir)
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
