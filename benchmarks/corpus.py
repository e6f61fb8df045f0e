"""Generated corpora with the benchmark schema: 10 float, 5 int, 5 short strings, 1 int label."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = [
    "tabular_table",
    "write_csv",
    "write_parquet",
    "ensure_csv",
    "ensure_parquet",
    "ensure_dataset",
    "FLOAT_COLS",
    "INT_COLS",
    "STR_COLS",
    "LABEL",
    "INDEX",
]

FLOAT_COLS = [f"f{i}" for i in range(10)]
INT_COLS = [f"i{i}" for i in range(5)]
STR_COLS = [f"s{i}" for i in range(5)]
LABEL = "label"
INDEX = "idx"  # the source index, in the indexed corpus only
_WORDS = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"])


# The text columns of each corpus (`text=`): a dozen words ("low", the default); ids, URLs,
# e-mails, hashes and SKUs, every value distinct ("high"); none ("none", numeric only); or
# the same rows' text stored as the int64 ids a vocabulary gives them ("low_codes",
# "high_codes": what text="ids" yields, as plain int64 columns).
TEXTS = ("low", "high", "none", "low_codes", "high_codes")
_HIGH = (
    lambda r: "user-%012x" % r,
    lambda r: "https://shop.example.com/p/%x?ref=%s" % (r, _WORDS[r % len(_WORDS)]),
    lambda r: "%x.%s@mail.example.org" % (r, _WORDS[r % 7]),
    lambda r: "%016x" % (r * 0x9E3779B97F4A7C15 % 2**64),
    lambda r: "SKU-%010d" % (r % 10**10),
)


def _text_column(rng, rows: int, text: str, column: int, first_row: int):
    if text.startswith("low"):
        words = rng.integers(0, len(_WORDS), size=rows)
        return words + 1 if text == "low_codes" else _WORDS[words]
    # Distinct across the corpus: the row's own number, scrambled (a vocabulary id's range).
    ids = (np.arange(first_row, first_row + rows, dtype=np.int64) * 7919 + column) % 2**40
    if text == "high_codes":
        return np.arange(first_row, first_row + rows, dtype=np.int64) + 1
    return np.array([_HIGH[column](int(r)) for r in ids], dtype=object)


def tabular_table(rows: int, *, seed: int = 0, text: str = "low", first_row: int = 0) -> pa.Table:
    if text not in TEXTS:
        raise ValueError(f"text must be one of {TEXTS}, got {text!r}")
    rng = np.random.default_rng(seed)
    cols = {}
    for name in FLOAT_COLS:
        cols[name] = np.round(rng.normal(size=rows), 5).astype(np.float32)
    for name in INT_COLS:
        cols[name] = rng.integers(-1000, 100000, size=rows)
    for i, name in enumerate(STR_COLS if text != "none" else ()):
        cols[name] = _text_column(rng, rows, text, i, first_row)
    cols[LABEL] = rng.integers(0, 10, size=rows)
    return pa.table(cols)


def _batches(rows: int, seed: int, batch_rows: int = 100_000, indexed: bool = False, text: str = "low"):
    for i, start in enumerate(range(0, rows, batch_rows)):
        table = tabular_table(min(batch_rows, rows - start), seed=seed * 100_003 + i, text=text, first_row=start)
        if indexed:
            table = table.add_column(0, INDEX, pa.array(np.arange(start, start + table.num_rows)))
        yield table


def write_csv(path: str, rows: int, *, seed: int = 0, indexed: bool = False, text: str = "low") -> str:
    """Writes `rows` rows in bounded memory; returns the path. `indexed`: with an INDEX column first."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = None
    with open(path, "wb") as f:
        for table in _batches(rows, seed, indexed=indexed, text=text):
            if writer is None:
                writer = pacsv.CSVWriter(f, table.schema, write_options=pacsv.WriteOptions(quoting_style="needed"))
            writer.write_table(table)
        if writer is not None:
            writer.close()
    return path


def write_parquet(path: str, rows: int, *, seed: int = 0, text: str = "low") -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = None
    for table in _batches(rows, seed, text=text):
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()
    return path


def _text_suffix(text: str) -> str:
    return "" if text == "low" else f"-{text}"


def ensure_csv(workdir: str, rows: int, *, indexed: bool = False, text: str = "low") -> str:
    """The `rows`-row CSV under `workdir`, generated on first use and reused after."""
    path = os.path.join(workdir, f"csv-{rows}{'-indexed' if indexed else ''}{_text_suffix(text)}", "data.csv")
    if not os.path.exists(path):
        write_csv(path, rows, indexed=indexed, text=text)
    return path


def ensure_parquet(workdir: str, rows: int, *, text: str = "low") -> str:
    """The same rows as `ensure_csv`, as Parquet."""
    path = os.path.join(workdir, f"parquet-{rows}{_text_suffix(text)}", "data.parquet")
    if not os.path.exists(path):
        write_parquet(path, rows, text=text)
    return path


def _current(dataset: str) -> bool:
    """Whether the dataset exists, converted by this version's format, with statistics."""
    import json

    from ingest import contract

    meta = os.path.join(dataset, "dataset_info.json")
    if not os.path.exists(meta):
        return False
    with open(meta) as f:
        d = json.load(f)
    # The format this version writes for these features (float64 ones need a later one).
    features = [contract.FeatureSpec.from_json(f) for f in d.get("features", [])]
    return "statistics" in d and d.get("format_version") == contract.format_version_of(features)


def ensure_dataset(
    workdir: str,
    rows: int,
    shards: int,
    *,
    layout: str = "rows",
    shuffle: bool = True,
    indexed: bool = False,
    block_rows: int = 1024,
    text: str = "low",
) -> str:
    """The CSV converted (label `label`, `shards` shards, `layout`), converted on first use
    (and again if an older version converted it: another format, or no statistics).

    `shuffle=False` converts with --no_shuffle; `indexed` adds the INDEX column (source order);
    `text` picks the text columns (TEXTS).
    """
    from beam_jobs import convert

    name = f"ds-{rows}-{shards}-{layout}" + ("" if shuffle else "-noshuffle") + ("-indexed" if indexed else "")
    if layout == "blocks" and block_rows != 1024:
        name += f"-k{block_rows}"
    name += _text_suffix(text)
    dataset = os.path.join(workdir, name)
    if not _current(dataset):
        convert.run(
            [
                "--source",
                "csv",
                "--input",
                ensure_csv(workdir, rows, indexed=indexed, text=text),
                "--output",
                dataset,
                "--label",
                LABEL,
                "--num_shards",
                str(shards),
                "--layout",
                layout,
                *(["--block_rows", str(block_rows)] if layout == "blocks" else []),
                "--overwrite",
                *([] if shuffle else ["--no_shuffle"]),
            ]
        )
    return dataset


def photo_like(rng, height: int, width: int):
    """An RGB image with photo statistics: smooth shading, edges and fine texture (not flat colour)."""
    import numpy as np
    from PIL import Image, ImageDraw

    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (width, height), Image.Resampling.BICUBIC
    )
    draw = ImageDraw.Draw(base)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(20, width // 2)), y0 + int(rng.integers(20, height // 2))
        draw.ellipse([x0, y0, x1, y1], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    texture = rng.normal(0, 9, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(base, np.float32) + texture, 0, 255).astype(np.uint8))


def ensure_images(
    workdir: str, count: int, *, height: int = 375, width: int = 500, classes: int = 10, quality: int = 90
) -> str:
    """`count` JPEGs as root/<class>/<n>.jpg, generated on first use; returns root."""
    import numpy as np

    root = os.path.join(workdir, f"images-{count}-{width}x{height}")
    done = os.path.join(root, ".complete")
    if not os.path.exists(done):
        rng = np.random.default_rng(0)
        for i in range(count):
            folder = os.path.join(root, f"class{i % classes:02d}")
            os.makedirs(folder, exist_ok=True)
            photo_like(rng, height, width).save(os.path.join(folder, f"{i:06d}.jpg"), "JPEG", quality=quality)
        open(done, "w").close()
    return root
