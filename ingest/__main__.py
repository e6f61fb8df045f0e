"""The `ingest` command line.

python -m ingest diagnose PATH --step_time_ms T
python -m ingest describe PATH [--split S] [--plot out.png]
python -m ingest compare BASELINE CURRENT [--split S] [--current_split S] [--threshold F=V ...] [--plot out.png]
python -m ingest service dispatcher --port 5050
python -m ingest service worker --dispatcher grpc://HOST:5050 [--port 5051]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ingest import _optional
from ingest.names import did_you_mean


def _load_callable(spec: str):
    module, sep, name = spec.partition(":")
    if not sep:
        raise SystemExit(f"error: --preprocess expects MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"error: cannot load --preprocess {spec}: {e}") from None


def model_step_time_ms(model_path: str, path: str, *, batch_size: int, split: str, preprocess=None) -> float:
    """Median time of the model's train step on this dataset's batches (input wait excluded)."""
    import numpy as np
    import tensorflow as tf

    import ingest

    model = tf.keras.models.load_model(model_path)
    ds = ingest.make_dataset(path, batch_size=batch_size, split=split, num_epochs=None, preprocess=preprocess)
    report = ingest.measure_train_step(model, ds, steps=20, warmup_steps=5)
    return 1000 * float(np.median(report.steady_computes))


def main(argv=None) -> int:
    args = _parse(_parser(), argv)
    # compare and describe read metadata only: no TensorFlow for local paths (its import took
    # 4-8 s and printed its start-up lines); a gs:// path loads it, or names the install.
    if args.command == "compare":  # its exit 1 means drift, so it reports errors itself, with 2
        return _compare(args)
    if args.command == "describe":
        return _describe(args)
    try:
        _optional.tensorflow(f"`ingest {args.command}`")
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.command == "service":
        return _service(args)
    return _diagnose(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ingest", description="ingest tools")
    sub = p.add_subparsers(dest="command", required=True)
    _add_diagnose(sub)
    _add_describe(sub)
    _add_compare(sub)
    _add_service(sub)
    return p


def _add_diagnose(sub) -> None:
    d = sub.add_parser("diagnose", help="name the stage that bounds the input pipeline and the fix")
    d.add_argument("path", help="a converted dataset (local or gs://)")
    demand = d.add_mutually_exclusive_group(required=True)
    demand.add_argument(
        "--step_time_ms", "--step-time-ms", type=float, help="the model's time per training step, e.g. from a profile"
    )
    demand.add_argument("--model", help="a saved Keras model (.keras): its train step is timed on real batches")
    d.add_argument("--batch_size", "--batch-size", type=int, default=256)
    d.add_argument("--split", default="train")
    d.add_argument("--preprocess", help="MODULE:FUNCTION applied to each batch, as passed to make_dataset")
    d.add_argument("--max_records", "--max-records", type=int, default=200_000, help="records measured per stage")


def _add_describe(sub) -> None:
    desc = sub.add_parser("describe", help="the statistics recorded at conversion: tables, and a PNG with --plot")
    desc.add_argument("path", help="a converted dataset (local or gs://)")
    desc.add_argument("--split", help="one split's statistics (default: all splits together)")
    desc.add_argument("--plot", help="write histograms and top values of every feature to this PNG")


def _add_compare(sub) -> None:
    cmp = sub.add_parser(
        "compare",
        help="drift of CURRENT from BASELINE, per feature, from their recorded statistics; exit 1 if any drifted",
    )
    cmp.add_argument("baseline", help="the reference dataset (local or gs://), or a glob of spans ('spans/2026-11-1*')")
    cmp.add_argument("current", help="the dataset (or glob of spans) to check against it")
    cmp.add_argument("--split", default="train", help="whose statistics to compare (default: train)")
    cmp.add_argument(
        "--current_split", "--current-split", help="the current side's split, if another (e.g. eval against train)"
    )
    cmp.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="FEATURE=VALUE",
        help="a feature's own distance threshold (repeatable); 1 never flags it",
    )
    cmp.add_argument(
        "--numeric_threshold", "--numeric-threshold", type=float, help="largest JS divergence that is not drift"
    )
    cmp.add_argument(
        "--categorical_threshold", "--categorical-threshold", type=float, help="largest L-infinity that is not drift"
    )
    cmp.add_argument(
        "--missing_threshold", "--missing-threshold", type=float, help="largest change in the share of missing records"
    )
    cmp.add_argument("--plot", help="write the worst features' histograms and top values to this PNG")


def _add_service(sub) -> None:
    svc = sub.add_parser("service", help="run a tf.data service dispatcher or worker (until stopped)")
    roles = svc.add_subparsers(dest="role", required=True)
    disp = roles.add_parser("dispatcher", help="hands out work and tracks workers")
    disp.add_argument("--port", type=int, required=True)
    disp.add_argument(
        "--work_dir", "--work-dir", help="journal directory (local or gs://); needed with --fault_tolerant"
    )
    disp.add_argument(
        "--fault_tolerant",
        "--fault-tolerant",
        action="store_true",
        help="recover state from --work_dir after a restart",
    )
    disp.add_argument(
        "--worker_timeout_ms", "--worker-timeout-ms", type=int, help="declare a silent worker dead after this long"
    )
    work = roles.add_parser("worker", help="runs input pipelines for the dispatcher's jobs")
    work.add_argument("--dispatcher", required=True, help="HOST:PORT or grpc://HOST:PORT")
    work.add_argument("--port", type=int, default=0, help="0 picks a free port")
    work.add_argument(
        "--worker_address",
        "--worker-address",
        help="HOST:%%port%% trainers use to reach this worker (default localhost:%%port%%)",
    )
    work.add_argument(
        "--heartbeat_interval_ms",
        "--heartbeat-interval-ms",
        type=int,
        help="how often to report to the dispatcher; keep well under its --worker_timeout_ms",
    )


def _diagnose(args) -> int:
    from ingest.inspection._diagnose import diagnose

    fn = _load_callable(args.preprocess) if args.preprocess else None
    try:
        if args.model:
            args.step_time_ms = model_step_time_ms(
                args.model, args.path, batch_size=args.batch_size, split=args.split, preprocess=fn
            )
            print(f"train step of {args.model}: {args.step_time_ms:.2f} ms (median of 20 steps after 5 warm-up)")
        result = diagnose(
            args.path,
            step_time_ms=args.step_time_ms,
            batch_size=args.batch_size,
            split=args.split,
            preprocess=fn,
            max_records=args.max_records,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.report())
    return 0


def _parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """`parser.parse_args`, where an unknown flag is named with the nearest of its command's
    flags (argparse says only 'unrecognized arguments'); exits with 2, as argparse does."""
    args, unknown = parser.parse_known_args(argv)
    if not unknown:
        return args
    command = _subcommand(parser, args)
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if not flags:
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    listed = [a.option_strings[-1 if a.option_strings[0] == "-h" else 0] for a in command._actions if a.option_strings]
    command.error(f"unknown flag {flags[0]}{did_you_mean(flags[0], known, quote=str)}; its flags: {', '.join(listed)}")


def _subcommand(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` were parsed for: `service worker`'s, `compare`'s, ..."""
    command = parser
    for name in (args.command, getattr(args, "role", None)):
        chooser = next((a for a in command._actions if isinstance(a, argparse._SubParsersAction)), None)
        if chooser is None or name not in chooser.choices:
            break
        command = chooser.choices[name]
    return command


# What matplotlib writes by the file's extension, for --plot: checked before any work, since
# its own error came after the tables, without naming --plot.
_PLOT_FORMATS = (".png", ".svg", ".pdf")


def _plot_path(arg: str) -> str:
    """The file --plot writes: `arg`, or `arg`.png where it has no extension (as matplotlib
    names it), or a ValueError naming --plot, what was wrong and what is valid."""
    if "://" not in arg and os.path.isdir(arg):
        raise ValueError(f"--plot {arg} is a directory: give a file to write, e.g. {os.path.join(arg, 'drift.png')}")
    stem, ext = os.path.splitext(arg)
    if not ext:
        return arg + ".png"
    if ext.lower() not in _PLOT_FORMATS:
        raise ValueError(
            f"--plot {arg}: cannot write a {ext} file; the plot is written as "
            f"{', '.join(e[1:].upper() for e in _PLOT_FORMATS)} by the extension, e.g. {stem}.png"
        )
    folder = os.path.dirname(arg)
    if "://" not in arg and not os.path.isdir(folder or "."):
        raise ValueError(f"--plot {arg}: the directory {folder} does not exist")
    return arg


def _describe(args) -> int:
    from ingest.inspection import _describe
    from ingest.metadata import _info

    try:
        plot = _plot_path(args.plot) if args.plot else None
        info = _info.load_info(args.path)
        print(_describe.describe(info, args.path, args.split))
        if plot:
            panels, left = _describe.plot(info, plot, args.split)
            print(f"\nwrote {plot} ({panels} features)")
            if left:
                print(f"left out of it ({len(left)}): " + "; ".join(f"{name} ({why})" for name, why in left))
    except (ValueError, KeyError, FileNotFoundError, ImportError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {message}", file=sys.stderr)
        return 1
    return 0


def _compare(args) -> int:
    """0: no drift; 1: drift (the last line names the features); 2: an error (one line)."""
    try:
        from ingest.inspection import _compare

        thresholds = dict(_feature_threshold(t) for t in args.threshold)
        # Before comparing: a drift found and then an unwritable plot would exit 2, not 1.
        plot = _plot_path(args.plot) if args.plot else None
        given = {
            k: v
            for k in ("numeric_threshold", "categorical_threshold", "missing_threshold")
            if (v := getattr(args, k)) is not None
        }
        report = _compare.compare(
            args.baseline,
            args.current,
            split=args.split,
            current_split=args.current_split,
            thresholds=thresholds,
            **given,
        )
        print(report)
        if plot:
            panels = report.plot(plot)
            print(f"\nwrote {plot} ({panels} features)")
    except (ValueError, KeyError, TypeError, OSError, ImportError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {message}", file=sys.stderr)
        return 2
    if report.drifted:
        print(f"\ndrift in {len(report.drifted)} feature(s): {', '.join(report.drifted)}")
        return 1
    return 0


def _feature_threshold(text: str) -> tuple:
    name, sep, value = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise ValueError(
            f"--threshold expects FEATURE=VALUE with a number for VALUE, e.g. wind=0.2; got {text!r}"
        ) from None


def _service(args) -> int:
    from ingest.pipeline import _service

    if args.role == "dispatcher":
        if args.fault_tolerant and not args.work_dir:
            print("error: --fault_tolerant needs --work_dir to journal into", file=sys.stderr)
            return 1
        _service.run_dispatcher(
            port=args.port,
            work_dir=args.work_dir,
            fault_tolerant=args.fault_tolerant,
            worker_timeout_ms=args.worker_timeout_ms,
        )
    else:
        _service.run_worker(
            dispatcher=args.dispatcher,
            port=args.port,
            worker_address=args.worker_address,
            heartbeat_interval_ms=args.heartbeat_interval_ms,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
