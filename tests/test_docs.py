"""The docs' Python examples run as written, on small datasets made here under the paths they use.

Every ```python block of docs/*.md runs, in order, each with what its page takes as given, in a working
directory holding out/ds, out/penguins, out/img, out/blocks, out/flights and out/main/dataset; a block
that cannot run here is marked `<!-- not run: why -->` just above it. The site itself is
built by `mkdocs build --strict` in `make test`.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import convert_table, run_convert, write_text

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks(page: pathlib.Path) -> list:
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group("code"), m.group("why")) for m in _BLOCK.finditer(text)]


PAGES = sorted(p for p in DOCS.glob("*.md") if not p.is_symlink())


def _penguins(root) -> str:
    rng = np.random.default_rng(0)
    species = rng.choice(["Adelie", "Gentoo", "Chinstrap"], 400)
    base = {"Adelie": 38.0, "Gentoo": 47.0, "Chinstrap": 49.0}
    # Missing values as the real table has them: a measurement and `sex` of a few rows are NA.
    lines = [
        f"{rng.choice(['Biscoe', 'Dream'])},{'NA' if i % 29 == 3 else f'{base[s] + rng.normal():.1f}'},"
        f"{190 + rng.integers(0, 30)},{'NA' if i % 17 == 5 else rng.choice(['male', 'female'])},{s}"
        for i, s in enumerate(species)
    ]
    return write_text(
        root / "penguins.csv", "island,bill_length_mm,flipper_length_mm,sex,species\n" + "\n".join(lines) + "\n"
    )


def _images(root) -> str:
    from PIL import Image

    rng = np.random.default_rng(1)
    for label in ("cat", "dog"):
        os.makedirs(root / "photos" / label)
        for i in range(8):
            pixels = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "photos" / label / f"{i}.jpg")
    return str(root / "photos")


def _flights(root) -> str:
    """docs/statistics.md's flights: 150 destinations (text), carriers and delays some
    records lack, flight numbers (identifiers), distances (a measurement)."""
    rng = np.random.default_rng(4)
    n = 3000
    carriers = np.array(["AA", "B6", "DL", "EV", "MQ", "UA", "US", "WN"], dtype=object)
    lacked = rng.random(n) < 0.05
    table = pa.table(
        {
            "dest": [f"A{k:03d}" for k in rng.integers(0, 150, n)],
            "carrier": pa.array(carriers[rng.integers(0, 8, n)], pa.string(), mask=lacked),
            "flight": rng.integers(1, 5000, n),
            "distance": rng.integers(1, 201, n) * 25,
            "delay": pa.array(rng.normal(10, 30, n).round(), pa.float32(), mask=rng.random(n) < 0.1),
            "late": rng.integers(0, 2, n),
        }
    )
    return convert_table(root / "flights", table, "--label", "late")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from benchmarks import corpus

    root = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(2)
    n = 2000
    src = write_text(
        root / "data" / "a.csv",
        "price,x,label\n" + "".join(f"{rng.lognormal(3, 1):.2f},{rng.normal():.3f},{i % 3}\n" for i in range(n)),
    )
    common = ("--splits", "train=0.8,eval=0.2")
    run_convert("--source", "csv", "--input", src, "--output", root / "out" / "ds", "--label", "label", *common)
    later = np.random.default_rng(3)  # a later day whose prices drifted up (docs/drift.md)
    new = write_text(
        root / "data" / "new.csv",
        "price,x,label\n" + "".join(f"{later.lognormal(4, 1):.2f},{later.normal():.3f},{i % 3}\n" for i in range(n)),
    )
    run_convert("--source", "csv", "--input", new, "--output", root / "out" / "ds-new", "--label", "label", *common)
    for day in range(21, 26):  # docs/spans.md: five days, each converted with the day before's schema
        rows = np.random.default_rng(day)
        src = write_text(
            root / "raw" / f"2026-11-{day}.csv",
            "price,x,label\n"
            + "".join(f"{rows.lognormal(3, 1):.2f},{rows.normal():.3f},{i % 3}\n" for i in range(400)),
        )
        carried = ("--schema_from", root / "out" / "spans" / f"2026-11-{day - 1}") if day > 21 else ("--label", "label")
        run_convert("--source", "csv", "--input", src, "--output", root / "out" / "spans" / f"2026-11-{day}", *carried)
    cents = np.random.default_rng(4)  # docs/runtime.md and docs/block_format.md: prices float32 would change
    money = write_text(
        root / "data" / "money.csv",
        "price,qty\n123456789.12,1.5\n"
        + "".join(
            f"{cents.integers(0, 10**8)}.{cents.integers(0, 100):02d},{cents.integers(0, 8) / 2}\n" for _ in range(199)
        ),
    )
    run_convert("--source", "csv", "--input", money, "--output", root / "out" / "money")
    penguins = _penguins(root)
    run_convert(
        "--source", "csv", "--input", penguins, "--output", root / "out" / "penguins", "--label", "species", *common
    )
    run_convert(
        "--source",
        "images",
        "--input",
        _images(root),
        "--output",
        root / "out" / "img",
        "--splits",
        "train=0.5,eval=0.5",
    )
    table = pa.table(
        {
            "x": rng.random(500).astype(np.float32),
            "pair": pa.array([[i, -i] for i in range(500)], pa.list_(pa.int64())),
            "tags": pa.array([list(range(i % 4)) for i in range(500)], pa.list_(pa.int64())),
            "name": pa.array([f"n{i % 7}".encode() for i in range(500)], pa.binary()),
        }
    )
    os.rename(_flights(root), root / "out" / "flights")
    blocks = convert_table(root / "blocks", table, "--block_rows", "64")
    os.rename(blocks, root / "out" / "blocks")
    csv = corpus.ensure_csv(str(root / "corpus"), 3000)
    run_convert(
        "--source", "csv", "--input", csv, "--output", root / "out" / "main" / "dataset", "--label", corpus.LABEL
    )
    return root


def _prelude(page: str) -> dict:
    """What a page's examples take as given: a model for out/ds, the shard files they read."""
    import keras
    import tensorflow as tf

    import ingest

    names = {"ingest": ingest, "tf": tf, "keras": keras, "np": np}
    if page == "runtime.md":
        inputs = {name: keras.Input(shape=(), name=name) for name in ("price", "x")}
        stacked = keras.layers.Concatenate()([keras.layers.Reshape((1,))(v) for v in inputs.values()])
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(stacked))
        model.compile("adam", "sparse_categorical_crossentropy")
        names["model"] = model
    if page == "block_format.md":
        names["files"] = sorted(glob.glob("out/blocks/train-*.tfrecord"))
    return names


def test_every_python_block_runs_or_says_why_not():
    for page in PAGES:
        for line, code, why in _blocks(page):
            assert why is None or why.strip(), f"{page.name}:{line}: a 'not run' mark needs its reason"
    assert sum(why is None for page in PAGES for _, _, why in _blocks(page)) >= 12


@pytest.mark.slow
@pytest.mark.parametrize("page", [p.name for p in PAGES if any(why is None for _, _, why in _blocks(p))])
def test_the_examples_of_each_page_run(workdir, monkeypatch, page):
    monkeypatch.chdir(workdir)
    for line, code, why in _blocks(DOCS / page):
        if why is None:  # each block on its own, with what the page takes as given
            exec(compile(code, f"docs/{page}:{line}", "exec"), _prelude(page))
