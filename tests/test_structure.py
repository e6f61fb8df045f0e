"""The house structure rules (HELPERS.md, STYLE.md): functions stay under 80 lines, docstrings aside;
ingest/ imports go one way down its floors; the public API is the listed one.

A long function hides its steps; the CLI's `main` had grown to 109 lines of argument
declarations for every subcommand before it was split per subcommand.
"""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 80
# Longer today, each to be split in its own change: (file, function) -> lines when listed.
# Empty since _request.build (96) took its pass-through fields from _check_call and
# benchmarks.main_job's main (95) was cut into its steps.
KNOWN_LONG: dict = {}


def _lines(node) -> int:
    """A function's lines, its docstring aside: make_dataset's grouped argument docs are most of its 195."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _long_functions() -> dict:
    out = {}
    for package in ("ingest", "beam_jobs", "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = _lines(node)
                    if lines > MAX_LINES:
                        out[(path.relative_to(REPO).as_posix(), node.name)] = lines
    return out


def test_no_function_grows_past_80_lines():
    grown = {key: lines for key, lines in _long_functions().items() if lines > KNOWN_LONG.get(key, MAX_LINES)}
    assert grown == {}, f"functions over {MAX_LINES} lines (or longer than when listed in KNOWN_LONG): {grown}"


def test_the_cli_has_a_function_per_subcommand_each_under_80_lines():
    tree = ast.parse((REPO / "ingest" / "__main__.py").read_text(encoding="utf-8"))
    functions = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert max(functions.values()) <= MAX_LINES, functions
    for command in ("diagnose", "describe", "compare", "service"):
        assert f"_add_{command}" in functions and f"_{command}" in functions, sorted(functions)


def test_every_commands_help_prints(capsys):
    """`ingest service worker --help` raised argparse's ValueError (a lone `%` in a help string)."""
    import pytest

    from ingest import __main__ as cli

    for command in ([], ["diagnose"], ["describe"], ["compare"], ["service"], ["service", "dispatcher"],
                    ["service", "worker"]):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            cli.main([*command, "--help"])
        assert done.value.code == 0, command
        assert "usage: ingest" in capsys.readouterr().out, command


# ingest/, floor by floor (ingest/*/__init__.py say the same): a module imports its own floor
# and those below, never one above; the two packages of the top floor stay apart.
FLOORS = {
    "ingest.contract": 0,  # shared with the conversion, pure Python
    "ingest.statistics": 0,
    "ingest.names": 0,
    "ingest._optional": 0,
    "ingest.metadata": 1,  # the dataset as recorded
    "ingest.pipeline": 2,  # the tf.data graph
    "ingest.inspection": 3,  # describe, compare, diagnose, the idle meter
    "ingest.bridges": 4,  # Keras, tf.distribute, preprocessing without Keras
    "ingest.stream": 4,  # ingest.loader: the pipeline in worker processes
    "ingest.__main__": 5,  # the CLI
    "ingest": 5,  # the public face (ingest/__init__.py)
}
SHARED = {"contract", "statistics", "names", "_optional"}


def _floor_of(module: str) -> tuple[str, int]:
    """The floor's name (its key in FLOORS) and number of a dotted module name in ingest."""
    parts = module.split(".")
    for n in (2, 1):
        key = ".".join(parts[:n])
        if key in FLOORS:
            return key, FLOORS[key]
    raise KeyError(f"{module}: on no floor of FLOORS; add its package there")


def _imports(module: str, source: str):
    """(line, imported module) for every import of ingest in a module's source, those inside
    functions included. `from ingest import x` names the module ingest.x when x is one."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import ingest` alone reads the package's location (ingest.__file__), no name of the face.
                if alias.name.startswith("ingest."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ingest":
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}" if node.module == "ingest" else node.module


def _upward_imports(sources: dict) -> list:
    """Imports that climb a floor or cross between the top floor's packages: (module, line, imported)."""
    out = []
    for module, source in sources.items():
        key, floor = _floor_of(module)
        for line, imported in _imports(module, source):
            name = imported.split(".")
            if (
                imported.startswith("ingest.")
                and name[1] not in SHARED
                and name[1] not in {"metadata", "pipeline", "inspection", "bridges", "stream", "__main__"}
            ):
                to_key, to_floor = "ingest", FLOORS["ingest"]  # a name of the face (`from ingest import make_dataset`)
            else:
                to_key, to_floor = _floor_of(imported)
            if to_floor > floor or (to_floor == floor and to_key != key and floor == 4):
                out.append((module, line, imported))
    return out  # fmt: skip


def _ingest_sources() -> dict:
    out = {}
    for path in sorted((REPO / "ingest").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text(encoding="utf-8")
    return out


def test_ingest_imports_go_one_way_down_its_floors():
    assert _upward_imports(_ingest_sources()) == []


def test_the_floor_check_sees_an_import_that_climbs():
    sources = {
        "ingest.metadata._info": "from ingest.pipeline import _request\n",
        "ingest.pipeline._read": "def f():\n    from ingest.inspection._describe import _table\n",
        "ingest.stream._loader": "from ingest.bridges import _keras\n",
        "ingest.bridges._keras": "from ingest import make_dataset\nfrom ingest import contract\n",
        "ingest.inspection._compare": "from ingest.statistics import X\nfrom ingest.pipeline import _dataset\n",
    }
    assert _upward_imports(sources) == [
        ("ingest.metadata._info", 1, "ingest.pipeline"),
        ("ingest.pipeline._read", 2, "ingest.inspection._describe"),
        ("ingest.stream._loader", 1, "ingest.bridges"),
        ("ingest.bridges._keras", 1, "ingest.make_dataset"),
    ]


def test_ingests_top_holds_the_face_the_shared_modules_and_the_floors():
    top = {p.stem for p in (REPO / "ingest").glob("*.py")}
    packages = {p.parent.name for p in (REPO / "ingest").glob("*/__init__.py")}
    assert top == {"__init__", "__main__"} | SHARED
    assert packages == {"metadata", "pipeline", "inspection", "bridges", "stream"}
    for package in packages:
        doc = ast.get_docstring(ast.parse((REPO / "ingest" / package / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc, f"ingest/{package}/__init__.py: say what it holds and what it may import"


def test_the_public_api_is_the_listed_one():
    import ingest

    assert sorted(ingest.__all__) == sorted([
        "make_dataset", "distribute", "load_info", "ReadOptions", "ImageOptions", "DatasetInfo", "FeatureSpec",
        "DatasetNotFoundError", "DatasetInfoError", "skipped_corrupt_records", "measure_idle", "measure_train_step",
        "batch_time_ms", "IdleReport", "diagnose", "feature_space", "Statistics", "FeatureStatistics", "FitStart",
        "StopAtStep", "spans", "compare", "DriftReport", "loader", "Loader", "WorkerError", "preprocessing",
        "Preprocessing",
    ])  # fmt: skip
    for name in ingest.__all__:
        assert getattr(ingest, name).__name__ == name, name
    # The public modules the conversion and users import by name.
    from ingest import contract, names, statistics, stream

    assert {"DatasetInfo", "FeatureSpec", "SplitInfo", "ShardInfo"} <= set(dir(contract))
    assert (
        callable(names.did_you_mean) and statistics.Statistics is ingest.Statistics and stream.loader is ingest.loader
    )
