"""docs/api.md is the reference scripts/api_reference.py writes from today's docstrings: readable
on a fresh clone without building the site, and never behind the code."""

from __future__ import annotations

import pathlib
import sys

import ingest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import api_reference  # noqa: E402


def test_the_api_reference_is_current():
    written = (REPO / "docs" / "api.md").read_text()
    assert written == api_reference.render(), (
        "docs/api.md is not what the docstrings give: run `.venv/bin/python scripts/api_reference.py` and commit it"
    )


def test_the_api_reference_covers_every_exported_name_with_its_docstring():
    listed = {name for _, names in api_reference.SECTIONS for name in names}
    assert {f"ingest.{n}" for n in ingest.__all__} <= listed
    text = (REPO / "docs" / "api.md").read_text()
    assert ":::" not in text  # no directive left for a plugin to expand: the file is the reference
    for name in ingest.__all__:
        assert f"### `ingest.{name}`" in text, name
    assert "Builds a tuned `tf.data.Dataset` of batches from a converted dataset." in text
