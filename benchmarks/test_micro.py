"""pytest-benchmark micro-benchmarks: `pytest benchmarks/` (not part of `make test`).

Parse throughput (per record vs vectorized per batch) and encoder rows/s, each with its
baseline in the same run, on the benchmark schema.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from beam_jobs import encode_record_batch
from benchmarks import corpus

ROWS = 8192


@pytest.fixture(scope="module")
def table():
    return corpus.tabular_table(ROWS, seed=0).combine_chunks()


@pytest.fixture(scope="module")
def records(table):
    buf, offsets = encode_record_batch(table)
    return [bytes(buf[offsets[i] : offsets[i + 1]]) for i in range(ROWS)]


@pytest.fixture(scope="module")
def spec():
    types = {
        **{c: tf.float32 for c in corpus.FLOAT_COLS},
        **{c: tf.int64 for c in corpus.INT_COLS + [corpus.LABEL]},
        **{c: tf.string for c in corpus.STR_COLS},
    }
    return {name: tf.io.FixedLenFeature([], dtype) for name, dtype in types.items()}


def test_encoder_columnar(benchmark, table):
    benchmark.extra_info["rows"] = ROWS
    benchmark(encode_record_batch, table)


def test_encoder_protobuf_baseline(benchmark, table):
    rows = table.slice(0, 1024).to_pylist()

    def encode():
        for row in rows:
            feature = {}
            for k, v in row.items():
                if isinstance(v, float):
                    feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                elif isinstance(v, int):
                    feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
                else:
                    feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    benchmark.extra_info["rows"] = 1024
    benchmark(encode)


def test_parse_vectorized_batch(benchmark, records, spec):
    batch = tf.constant(records[:1024])
    parse = tf.function(lambda b: tf.io.parse_example(b, spec))
    benchmark.extra_info["rows"] = 1024
    benchmark(parse, batch)


def test_parse_per_record_baseline(benchmark, records, spec):
    batch = tf.constant(records[:1024])
    parse = tf.function(
        lambda b: tf.map_fn(
            lambda r: tf.io.parse_single_example(r, spec), b, fn_output_signature={k: v.dtype for k, v in spec.items()}
        )
    )
    benchmark.extra_info["rows"] = 1024
    benchmark(parse, batch)


def test_conversion_job_rows(benchmark, tmp_path_factory):
    """The whole Beam job (DirectRunner, in-process) on a 20k-row CSV: rows/s end to end."""
    from beam_jobs import convert

    root = tmp_path_factory.mktemp("conv")
    csv_path = corpus.write_csv(str(root / "data.csv"), 20_000)
    runs = iter(range(100))

    def convert_once():
        convert.run(
            [
                "--source",
                "csv",
                "--input",
                csv_path,
                "--output",
                str(root / f"out-{next(runs)}"),
                "--label",
                corpus.LABEL,
            ]
        )

    benchmark.extra_info["rows"] = 20_000
    benchmark.pedantic(convert_once, rounds=3, iterations=1)
