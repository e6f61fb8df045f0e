"""The dependency boundary: the conversion (and its Dataflow workers) runs without TensorFlow
or matplotlib, and what needs them says how to install them.

Each test runs in a fresh interpreter, since this one has TensorFlow loaded. TensorFlow is
installed here, so "not installed" is faked at the import seam: a None entry in
sys.modules makes `import tensorflow` raise ModuleNotFoundError(name='tensorflow'), as on a
machine without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import ingest

REPO = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ("tensorflow", "matplotlib")


def _python(code: str, *, blocked=()) -> subprocess.CompletedProcess:
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, check=False
    )


def _last_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_every_conversion_module_imports_without_loading_tensorflow_or_matplotlib():
    proc = _python("""
        import importlib, json, pkgutil, sys
        import beam_jobs
        modules = ["beam_jobs", "ingest", "ingest.contract"]
        modules += [m.name for m in pkgutil.walk_packages(beam_jobs.__path__, "beam_jobs.")]
        for name in modules:
            importlib.import_module(name)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "matplotlib"))
        print(json.dumps({"imported": modules, "heavy": heavy}))
    """)
    result = json.loads(_last_line(proc))
    assert {"beam_jobs.convert", "beam_jobs._pipeline", "beam_jobs.sources"} <= set(result["imported"])
    assert result["heavy"] == []


@pytest.mark.slow
def test_conversion_runs_where_tensorflow_and_matplotlib_cannot_be_imported(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,a\n2,b\n3,c\n")
    proc = _python(
        f"""
        from beam_jobs import convert
        info = convert.run(["--source", "csv", "--input", {str(tmp_path / "a.csv")!r},
                            "--output", {str(tmp_path / "out")!r}, "--label", "x"])
        print(sum(s.records for s in info.splits))
    """,
        blocked=HEAVY,
    )
    assert _last_line(proc) == "3"
    assert (tmp_path / "out" / "dataset_info.json").exists()


def test_import_ingest_without_tensorflow_keeps_the_contract():
    proc = _python(
        """
        import ingest
        from ingest import contract
        print(ingest.DatasetInfo is contract.DatasetInfo, ingest.FeatureSpec is contract.FeatureSpec)
    """,
        blocked=["tensorflow"],
    )
    assert _last_line(proc) == "True True"


def test_every_public_name_resolves_or_names_the_tf_install_command_without_tensorflow():
    proc = _python(
        """
        import json
        import ingest
        out = {}
        for name in ingest.__all__:
            try:
                getattr(ingest, name)
                out[name] = "ok"
            except ImportError as e:
                out[name] = f"{type(e).__name__}: {e}"
        print(json.dumps(out))
    """,
        blocked=["tensorflow"],
    )
    result = json.loads(_last_line(proc))
    assert set(result) == set(ingest.__all__)
    for name, outcome in result.items():
        # A plain ImportError (not the bare ModuleNotFoundError) that names the call and the command.
        assert outcome == "ok" or outcome == (
            f"ImportError: ingest.{name} needs TensorFlow, which is not "
            "installed. Install it with: pip install 'ingest[tf]'"
        ), (name, outcome)
    assert result["make_dataset"] != "ok" and result["DatasetInfo"] == "ok"


def test_from_import_of_make_dataset_without_tensorflow_raises_with_the_install_command():
    proc = _python(
        """
        try:
            from ingest import make_dataset
        except ImportError as e:
            print(type(e).__name__, "|", e, "|", type(e.__cause__).__name__, e.__cause__.name)
    """,
        blocked=["tensorflow"],
    )
    assert _last_line(proc) == (
        "ImportError | ingest.make_dataset needs TensorFlow, which is not installed. "
        "Install it with: pip install 'ingest[tf]' | ModuleNotFoundError tensorflow"
    )


def test_calls_that_import_tensorflow_late_name_the_install_command(tmp_path):
    # diagnose and measure_idle load without TensorFlow (their modules hold pure parts too)
    # and need it only when called.
    proc = _python(
        f"""
        import ingest
        for call in (lambda: ingest.diagnose({str(tmp_path)!r}, step_time_ms=10),
                     lambda: ingest.measure_idle([[1, 2]], step_time_ms=0, warmup_steps=0)):
            try:
                call()
            except ImportError as e:
                print(e)
    """,
        blocked=["tensorflow"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [
        f"ingest.{name} needs TensorFlow, which is not installed. Install it with: pip install 'ingest[tf]'"
        for name in ("diagnose", "measure_idle")
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["diagnose", "somewhere", "--step_time_ms", "10"],
        ["service", "dispatcher", "--port", "0"],
    ],
)
def test_the_ingest_command_without_tensorflow_prints_the_install_command(command):
    proc = _python(
        f"""
        import runpy
        sys.argv = ["ingest", *{command!r}]
        runpy.run_module("ingest", run_name="__main__", alter_sys=True)
    """,
        blocked=["tensorflow"],
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: `ingest {command[0]}` needs TensorFlow, which is not installed. "
        "Install it with: pip install 'ingest[tf]'"
    )


@pytest.fixture(scope="module")
def two_spans(tmp_path_factory) -> str:
    """A directory of two converted daily spans (with statistics)."""
    from beam_jobs import convert

    root = tmp_path_factory.mktemp("metadata")
    for day, rows in (("2026-11-25", "1.5,a\n2.5,b\n"), ("2026-11-26", "3.5,a\n-1,c\n")):
        (root / f"{day}.csv").write_text("x,c\n" + rows)
        convert.run(["--source", "csv", "--input", str(root / f"{day}.csv"), "--output", str(root / "spans" / day)])
    return str(root / "spans")


def _tensorflow_loaded() -> str:
    return 'print("tensorflow loaded:", any(m.split(".")[0] == "tensorflow" for m in sys.modules))'


def test_metadata_calls_do_not_import_tensorflow(two_spans):
    day = f"{two_spans}/2026-11-25"
    proc = _python(f"""
        import ingest
        info = ingest.load_info({day!r})
        found = ingest.spans({two_spans!r})
        merged = ingest.load_info({two_spans + "/*"!r})
        x = merged.statistics.of("train")["x"]
        report = ingest.compare({day!r}, found, split=None)
        print(len(found), x.count, x.min, x.max, len(report.rows))
        {_tensorflow_loaded()}
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == ["2 4 -1.0 3.5 2", "tensorflow loaded: False"]


@pytest.mark.parametrize(
    "command",
    [
        ["describe", "{day}"],
        ["describe", "{day}", "--split", "train"],
        ["compare", "{spans}/*", "{spans}/2026-11-2*"],
    ],
)
def test_metadata_commands_do_not_import_tensorflow_or_print_its_log(two_spans, command):
    argv = [a.format(day=f"{two_spans}/2026-11-25", spans=two_spans) for a in command]
    proc = _python(f"""
        import runpy
        sys.argv = ["ingest", *{argv!r}]
        try:
            runpy.run_module("ingest", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            print("exit", e.code)
        {_tensorflow_loaded()}
    """)
    lines = proc.stdout.strip().splitlines()
    assert lines[-2:] == ["exit 0", "tensorflow loaded: False"], proc.stdout + proc.stderr[-3000:]
    assert proc.stderr == ""  # TensorFlow's start-up lines (oneDNN, CUDA, cpu_feature_guard) go here


def test_a_broken_module_inside_ingest_is_not_reported_as_tensorflow_missing():
    proc = _python(
        """
        import ingest
        try:
            ingest.make_dataset
        except ModuleNotFoundError as e:
            print(type(e).__name__, e.name)
    """,
        blocked=["ingest.pipeline._dataset"],
    )
    assert _last_line(proc) == "ModuleNotFoundError ingest.pipeline._dataset"


def test_only_tensorflow_itself_counts_as_tensorflow_missing():
    from ingest._optional import is_missing

    assert is_missing(ModuleNotFoundError(name="tensorflow"), "tensorflow")
    assert is_missing(ModuleNotFoundError(name="tensorflow.python"), "tensorflow")
    assert not is_missing(ModuleNotFoundError(name="tensorflow_io"), "tensorflow")
    assert not is_missing(ModuleNotFoundError(name="absl"), "tensorflow")
    assert not is_missing(ModuleNotFoundError("no name given"), "tensorflow")


@pytest.mark.parametrize(
    "argv",
    [
        ["benchmarks.main_job", "--out", "{tmp}/main"],
        ["benchmarks", "--quick", "--out", "{tmp}/suite", "--workdir", "{tmp}/data"],
    ],
)
def test_benchmarks_without_matplotlib_stop_before_any_work_with_the_install_command(tmp_path, argv):
    module, *args = [a.format(tmp=tmp_path) for a in argv]
    proc = _python(
        f"""
        import runpy
        sys.argv = [{module!r}, *{args!r}]
        runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
    """,
        blocked=["matplotlib"],
    )
    assert proc.returncode != 0
    assert (
        "ImportError: the benchmarks' plots need matplotlib, which is not installed. "
        "Install it with: pip install 'ingest[plot]'"
    ) in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no corpus generated, nothing converted


# setuptools' editable install: a finder appended to sys.meta_path, after the path search.
_EDITABLE_FINDER = """
import importlib.util, sys

class Editable:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "ingest":
            return importlib.util.spec_from_file_location(name, {init!r}, submodule_search_locations=[{package!r}])

sys.meta_path.append(Editable)
"""


def _script_beside_the_checkout(tmp_path, body: str, *, editable: bool) -> subprocess.CompletedProcess:
    """Runs a script from a folder holding this checkout as `ingest/`, as a user's ~/code holds
    their clone: Python puts the script's folder first on sys.path. -S leaves out site-packages
    (and this environment's own install of ingest): what is installed is what the script says."""
    (tmp_path / "ingest").symlink_to(REPO, target_is_directory=True)
    finder = _EDITABLE_FINDER.format(init=str(REPO / "ingest" / "__init__.py"), package=str(REPO / "ingest"))
    (tmp_path / "train.py").write_text((finder if editable else "") + textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-S", "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env, check=False
    )


def test_a_script_beside_the_checkout_imports_the_installed_package_not_the_checkout_folder(tmp_path):
    proc = _script_beside_the_checkout(
        tmp_path,
        """
        import ingest
        from ingest import _optional  # a submodule of the package, found under its name
        print(ingest.__file__, "load_info" in ingest.__all__, _optional.__file__)
        """,
        editable=True,
    )
    # The folder was an empty namespace package that shadowed the install: no load_info.
    assert _last_line(proc) == f"{REPO / 'ingest' / '__init__.py'} True {REPO / 'ingest' / '_optional.py'}"


def test_a_script_beside_a_checkout_that_is_not_installed_is_told_what_happened(tmp_path):
    proc = _script_beside_the_checkout(tmp_path, "import ingest\ningest.load_info\n", editable=False)
    assert proc.returncode == 1
    checkout = re.escape(str(tmp_path / "ingest"))
    assert re.fullmatch(
        rf"ImportError: `import ingest` found {checkout}, an ingest checkout \(the repository's folder\), not the "
        rf"ingest package: Python looks first in {re.escape(str(tmp_path))}, the folder of the running script .* "
        rf"Install it \(pip install -e {checkout}\), or add {checkout} to PYTHONPATH, or run the script from another "
        "folder",
        proc.stderr.strip().splitlines()[-1],
    )
