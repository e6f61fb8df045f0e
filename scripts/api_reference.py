"""Writes docs/api.md, the API reference, from the public names' signatures and docstrings.

Markdown kept in the repository, so that the reference reads on a fresh clone (or on
GitHub) without building the site; `tests/test_api_reference.py` fails when it is not
what this script writes from the code. After changing a public signature or docstring:

    .venv/bin/python scripts/api_reference.py
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"

# (section, [public names]): every name in `ingest.__all__`, and the conversion's entry points.
SECTIONS = (
    ("Reading", ["ingest.make_dataset", "ingest.distribute", "ingest.load_info", "ingest.spans",
                 "ingest.ReadOptions", "ingest.ImageOptions", "ingest.skipped_corrupt_records"]),
    ("PyTorch, JAX and numpy", ["ingest.loader", "ingest.Loader", "ingest.WorkerError", "ingest.preprocessing",
                                "ingest.Preprocessing"]),
    ("Resuming Keras' fit", ["ingest.FitStart", "ingest.StopAtStep"]),
    ("Metadata", ["ingest.DatasetInfo", "ingest.FeatureSpec", "ingest.Statistics", "ingest.FeatureStatistics",
                  "ingest.DatasetNotFoundError", "ingest.DatasetInfoError"]),
    ("Drift", ["ingest.compare", "ingest.DriftReport"]),
    ("Measuring and preprocessing", ["ingest.measure_idle", "ingest.measure_train_step", "ingest.batch_time_ms",
                                     "ingest.IdleReport", "ingest.diagnose", "ingest.feature_space"]),
    ("Conversion", ["beam_jobs.WriteDataset", "beam_jobs.convert.run"]),
)  # fmt: skip

HEAD = """# API reference

<!-- Generated from the docstrings by scripts/api_reference.py: edit those, then run
`.venv/bin/python scripts/api_reference.py`. tests/test_api_reference.py checks it is current. -->

`ingest` exports these names (`import ingest`); the conversion's Python entry points are
`beam_jobs.WriteDataset` and `beam_jobs.convert.run`. Each entry: its signature, then its
docstring as written.
"""


def resolve(name: str):
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class _Written(str):
    """An annotation as written in the source (they are strings: `from __future__ import
    annotations`), shown without the quotes a str's repr adds."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj, width: int = 100) -> str:
    """`(params) -> return`, one parameter a line when longer than `width`."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def written(a):
        return _Written(a) if isinstance(a, str) else a

    params = [p.replace(annotation=written(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=written(sig.return_annotation))
    text = str(sig)
    if len(text) <= width:
        return text
    shown = str(sig.replace(parameters=[])).removeprefix("()")  # " -> return", or ""
    parts, star = [], False
    for p in sig.parameters.values():
        star = star or p.kind is inspect.Parameter.VAR_POSITIONAL  # a *args takes the bare * 's place
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(str(p))
    return "(\n" + "".join(f"    {p},\n" for p in parts) + ")" + shown


def _doc(obj) -> str:
    doc = inspect.getdoc(obj)
    return f"```text\n{doc}\n```\n" if doc else "(no docstring)\n"


def _members(cls) -> list:
    """A class's own public methods and properties, with their docstrings, in source order."""
    out = []
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name, member in vars(cls).items():
        if name.startswith("_") or name in fields or not (inspect.getdoc(member) or "").strip():
            continue
        if isinstance(member, property):
            out.append(f"#### `{cls.__name__}.{name}` (property)\n\n{_doc(member)}")
        elif isinstance(member, (classmethod, staticmethod)):
            func = member.__func__
            out.append(f"#### `{cls.__name__}.{name}{_signature(member.__get__(None, cls))}`\n\n{_doc(func)}")
        elif inspect.isfunction(member):
            out.append(f"#### `{cls.__name__}.{name}{_signature(member)}`\n\n{_doc(member)}")
    return out


def entry(name: str) -> str:
    obj = resolve(name)
    kind = "class" if inspect.isclass(obj) else "function"
    parts = [f"### `{name}`\n", f"```text\n{kind} {name}{_signature(obj)}\n```\n", _doc(obj)]
    if inspect.isclass(obj):
        parts += _members(obj)
    return "\n".join(parts)


def render() -> str:
    sections = [HEAD]
    for title, names in SECTIONS:
        sections.append(f"## {title}\n")
        sections += [entry(n) for n in names]
    return "\n".join(sections)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    OUT.write_text(render())
    print(f"wrote {OUT}")
