"""The README's first example runs as written: its shell commands, then its Python, from a
working directory laid out as the repository's root (examples/penguins.csv, shipped)."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil

import pytest

from ingest import __main__ as cli
from tests.conftest import run_convert

REPO = pathlib.Path(__file__).resolve().parents[1]


def _first_example() -> tuple:
    """(the ```sh block's commands, the ```python block after it) under "Convert, then train"."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Convert, then train") :]
    sh = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line.split("#")[0]) for line in sh.replace("\\\n", " ").splitlines() if line.strip()]
    return commands, code


def test_the_shipped_penguins_are_the_generators_and_look_like_the_real_ones():
    from examples.make_penguins import COLUMNS, rows

    lines = (REPO / "examples" / "penguins.csv").read_text().splitlines()
    assert lines[0].split(",") == COLUMNS and lines[1:] == [",".join(r) for r in rows()]  # regenerated as said
    species = [line.split(",")[0] for line in lines[1:]]
    assert {s: species.count(s) for s in set(species)} == {"Adelie": 152, "Chinstrap": 68, "Gentoo": 124}


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path, monkeypatch, capsys):
    commands, code = _first_example()
    assert [c[:3] for c in commands] == [
        [".venv/bin/python", "-m", "beam_jobs.convert"],
        [".venv/bin/python", "-m", "ingest"],
    ]
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    run_convert(*commands[0][3:])
    assert cli.main(commands[1][3:]) == 0
    described = capsys.readouterr().out
    assert "| species (label) | text (length) | 0% |" in described and "| sex | text (length) | 3.2% |" in described
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    names: dict = {}
    exec(compile(code, "README.md", "exec"), names)
    assert names["info"].labels == ("Adelie", "Chinstrap", "Gentoo")
    _, accuracy = names["model"].evaluate(names["val"], verbose=0)
    # It learns: 50 steps of Adam took 0.75 here, where always guessing Adelie takes 0.44.
    assert accuracy > 0.55
