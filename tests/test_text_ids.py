"""Text as ids (#37): vocabularies recorded at conversion, `make_dataset(text="ids")`.

Ids are checked against the strings of the same rows read with text="strings", through the
vocabulary the metadata names, not against the code's own idea of an id: a value's id is
its position in `load_info(path).vocabulary(name)` plus one, 0 is out of vocabulary.
"""

from __future__ import annotations

import collections
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import ingest
from beam_jobs.convert import ConversionError
from beam_jobs.stats import vocabulary as vocab_stats
from tests.conftest import convert_table, run_convert
from tests.test_spans import _as_format_2

N = 3000


def _table(seed: int = 0, n: int = N, new_words: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30 + new_words)]
    # Skewed: low ids are frequent, so the vocabulary's order is the frequency order.
    city = [words[min(int(k), len(words) - 1)] for k in rng.geometric(0.15, n) - 1]
    tags = [[words[int(k)] for k in rng.integers(0, 30, int(m))] for m in rng.integers(0, 4, n)]
    pair = [[words[int(a)], words[int(b)]] for a, b in rng.integers(0, 30, (n, 2))]
    url = [f"https://example.com/{seed}/{i}" for i in range(n)]  # every value distinct
    missing = [None if i % 7 == 0 else words[i % 5] for i in range(n)]
    return pa.table(
        {
            "id": pa.array(np.arange(n) + seed * 1_000_000),
            "x": pa.array(rng.normal(size=n).astype(np.float32)),
            "city": city,
            "tags": pa.array(tags, pa.list_(pa.string())),
            "pair": pa.array(pair, pa.list_(pa.string(), 2)),
            "url": url,
            "maybe": missing,
            "label": [["cat", "dog"][int(i)] for i in rng.integers(0, 2, n)],
        }
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    return convert_table(root, _table(), "--label", "label", "--block_rows", "64", "--num_shards", "3")


def _lookup(info, name):
    return np.array([b""] + [v.encode() for v in info.vocabulary(name)], dtype=object)


def _by_id(ds, names):
    """{row id: {name: value or list}} over one pass of `ds`."""
    out = {}
    for x, _ in ds:
        columns = {n: x[n].to_list() if isinstance(x[n], tf.RaggedTensor) else x[n].numpy().tolist() for n in names}
        for i, row_id in enumerate(x["id"].numpy().tolist()):
            out[row_id] = {n: columns[n][i] for n in names}
    return out


TEXT = ("city", "tags", "pair", "url", "maybe")


def test_the_vocabulary_lists_each_text_features_values_most_frequent_first(dataset):
    info = ingest.load_info(dataset)
    assert set(info.vocabularies) == set(TEXT)  # the label has classes instead; numbers none
    table = _table()
    for name in TEXT:
        values = table.column(name).to_pylist()
        flat = [v for row in values for v in (row if isinstance(row, list) else [row]) if v is not None]
        counts = collections.Counter(flat)
        expected = sorted(counts, key=lambda v: (counts[v], v.encode()), reverse=True)  # ties: larger first
        assert list(info.vocabulary(name)) == expected, name
        assert info.vocabularies[name]["size"] == len(expected)
    with pytest.raises(KeyError, match=r"feature 'x' has no vocabulary; the features that have one: \['city'"):
        info.vocabulary("x")


@pytest.mark.parametrize("seekable", [True, False])
def test_ids_are_the_vocabulary_positions_of_the_strings_of_the_same_rows(dataset, seekable):
    info = ingest.load_info(dataset)
    options = ingest.ReadOptions(seekable_order=seekable)
    kw = dict(batch_size=100, shuffle=False, options=options)
    strings = _by_id(ingest.make_dataset(dataset, **kw), TEXT)
    ds = ingest.make_dataset(dataset, text="ids", **kw)
    for name in TEXT:
        spec = ds.element_spec[0][name]
        assert spec.dtype == tf.int64, name
    ids = _by_id(ds, TEXT)
    assert len(ids) == N and ids.keys() == strings.keys()
    for name in TEXT:
        lookup = _lookup(info, name)
        for row_id, row in ids.items():
            got = row[name]
            decoded = [lookup[i] for i in got] if isinstance(got, list) else lookup[got]
            want = strings[row_id][name]
            if name == "maybe" and want == b"":  # missing: the default, which is no value of it
                assert got == 0
            else:
                assert decoded == want, (name, row_id)
                assert (min(got) if isinstance(got, list) and got else got or 1) >= 1


def test_ids_build_no_string_tensor_from_the_blocks(dataset):
    """The parse of a window asks for no bytes list: the dictionaries' strings are never made."""
    # (the text label, yielded as its class id, is not among them: it is parsed as text)
    ds = ingest.make_dataset(dataset, batch_size=100, text="ids", features=["id", *TEXT], label=False)
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    parses = [n for f in graph.library.function for n in f.node_def if n.op == "ParseExampleV2"]
    assert parses
    for node in parses:
        assert tf.string.as_datatype_enum not in node.attr["ragged_value_types"].list.type
    strings = ingest.make_dataset(dataset, batch_size=100, features=["id", *TEXT], label=False)
    graph = tf.compat.v1.GraphDef.FromString(strings._as_serialized_graph().numpy())
    parses = [n for f in graph.library.function for n in f.node_def if n.op == "ParseExampleV2"]
    assert any(tf.string.as_datatype_enum in n.attr["ragged_value_types"].list.type for n in parses)


@pytest.mark.slow
def test_every_row_comes_once_per_epoch_with_many_windows_in_flight(dataset):
    options = ingest.ReadOptions(num_parallel_calls=5, block_window=2)
    ds = ingest.make_dataset(dataset, batch_size=32, seed=3, num_epochs=2, text="ids", options=options)
    rows = [int(i) for x, _ in ds for i in x["id"].numpy()]
    assert sorted(rows[:N]) == list(range(N)) and sorted(rows[N:]) == list(range(N))
    assert rows[:N] != rows[N:]  # each epoch its own order
    one = ingest.ReadOptions(num_parallel_calls=1, block_window=2)
    serial = ingest.make_dataset(dataset, batch_size=32, seed=3, num_epochs=2, text="ids", options=one)
    assert [int(i) for x, _ in serial for i in x["id"].numpy()] == rows  # in flight or not: the same order


def test_a_checkpoint_with_windows_in_flight_resumes_at_the_next_batch(dataset, tmp_path):
    options = ingest.ReadOptions(num_parallel_calls=4, block_window=2)

    def make():
        return ingest.make_dataset(dataset, batch_size=50, seed=9, num_epochs=None, text="ids", options=options)

    it = iter(make())
    for _ in range(17):
        next(it)
    ckpt = tf.train.Checkpoint(it=it)
    saved = ckpt.write(str(tmp_path / "ckpt"))
    expected = [next(it)[0]["url"].numpy().tolist() for _ in range(30)]
    restored = iter(make())
    tf.train.Checkpoint(it=restored).read(saved).assert_consumed()
    assert [next(restored)[0]["url"].numpy().tolist() for _ in range(30)] == expected
    assert os.path.getsize(saved + ".data-00000-of-00001") < 16_384


@pytest.mark.slow
def test_a_later_span_keeps_every_id_and_adds_its_new_values(tmp_path):
    first = convert_table(tmp_path / "a", _table(0), "--label", "label", "--block_rows", "64")
    second_in = tmp_path / "b"
    os.makedirs(second_in / "in")
    import pyarrow.parquet as pq

    pq.write_table(_table(1, new_words=20), str(second_in / "in" / "a.parquet"))
    run_convert(
        "--source", "parquet", "--input", second_in / "in" / "a.parquet", "--output", second_in / "ds",
        "--schema_from", first, "--block_rows", "64",
    )  # fmt: skip
    second = str(second_in / "ds")
    old, new = ingest.load_info(first), ingest.load_info(second)
    for name in ("city", "tags", "maybe"):
        assert new.vocabulary(name)[: len(old.vocabulary(name))] == old.vocabulary(name)
    assert len(new.vocabulary("city")) > len(old.vocabulary("city"))  # w30... are new
    assert new.vocabulary("url")[: len(old.vocabulary("url"))] == old.vocabulary("url")
    both = ingest.load_info([first, second])
    assert both.vocabulary("city") == new.vocabulary("city")
    strings = _by_id(ingest.make_dataset([first, second], batch_size=100, shuffle=False), ["city"])
    ids = _by_id(ingest.make_dataset([first, second], batch_size=100, shuffle=False, text="ids"), ["city"])
    lookup = _lookup(new, "city")
    assert len(ids) == 2 * N
    assert all(lookup[row["city"]] == strings[i]["city"] for i, row in ids.items())


def test_the_label_comes_apart_as_label_ids_says_and_among_the_features_is_refused(dataset):
    """A recorded text label has classes, not a vocabulary: apart, it is its class id or (label_ids=False)
    its text beside the features' ids; kept among the features, text="ids" refuses it saying why and what
    to do (it said "converted with format_version 4, before vocabularies (4)", and refused label_ids=False)."""
    info = ingest.load_info(dataset)
    kw = dict(batch_size=50, shuffle=False, text="ids", features=["id", "city", "label"])
    strings = [y for _, y in ingest.make_dataset(dataset, batch_size=50, shuffle=False, label_ids=False)]
    as_text = list(ingest.make_dataset(dataset, label_ids=False, **kw))
    assert as_text[0][0]["city"].dtype == tf.int64 and as_text[0][1].dtype == tf.string
    assert [y.numpy().tolist() for _, y in as_text] == [y.numpy().tolist() for y in strings]
    as_ids = [y.numpy() for _, y in ingest.make_dataset(dataset, **kw)]
    assert [info.labels[i].encode() for y in as_ids for i in y] == [v for y in strings for v in y.numpy().tolist()]
    for among in (dict(label=False), dict(label="city", features=["id", "city", "label"])):
        with pytest.raises(
            ValueError,
            match=r"feature 'label' is the label .* records, read here among the features .*a label has classes "
            r"\(load_info\(path\).labels\), not a vocabulary.* Yield it apart as the label .*features=\[\.\.\.\]",
        ):
            ingest.make_dataset(dataset, **{**kw, **among})


def test_spans_converted_apart_are_refused_for_ids_but_read_as_strings(tmp_path):
    a = convert_table(tmp_path / "a", _table(0), "--label", "label")
    b = convert_table(tmp_path / "b", _table(1, new_words=20), "--label", "label")
    with pytest.raises(ValueError, match=r"vocabulary of feature '\w+' in .* is not the start of the others'"):
        ingest.make_dataset([a, b], batch_size=10, text="ids")
    assert sum(len(y) for _, y in ingest.make_dataset([a, b], batch_size=1000)) == 2 * N


def test_a_feature_past_the_vocabulary_limit_has_none_and_ids_refuse_it(tmp_path, monkeypatch):
    from ingest import contract

    monkeypatch.setattr(contract, "VOCABULARY_LIMIT", 100)
    path = convert_table(tmp_path, _table(), "--label", "label")
    info = ingest.load_info(path)
    assert "url" not in info.vocabularies and "city" in info.vocabularies
    assert any("'url': more than 100 distinct values" in w for w in info.warnings)
    with pytest.raises(ValueError, match=r"no vocabulary for feature 'url' \(text feature 'url': more than 100"):
        ingest.make_dataset(path, batch_size=10, text="ids")
    ds = ingest.make_dataset(path, batch_size=10, text="ids", features=["id", "city"])
    assert ds.element_spec[0]["city"].dtype == tf.int64


def test_datasets_without_vocabularies_and_the_rows_layout_are_refused_for_ids(tmp_path):
    rows = convert_table(tmp_path / "rows", _table(), "--label", "label", "--layout", "rows")
    with pytest.raises(ValueError, match=r"text='ids' reads ids the blocks layout stores; .* layout 'rows'"):
        ingest.make_dataset(rows, batch_size=10, text="ids")
    old = convert_table(tmp_path / "old", _table(), "--label", "label", "--block_rows", "64")
    _as_format_2(old)  # as an older ingest wrote it: no vocabularies, no ids
    with pytest.raises(ValueError, match=r"converted with format_version 2, before vocabularies"):
        ingest.make_dataset(str(old), batch_size=10, text="ids")
    with pytest.raises(ValueError, match=r"text must be one of \('strings', 'ids'\), got 'id'"):
        ingest.make_dataset(str(old), batch_size=10, text="id")
    assert sum(len(y) for _, y in ingest.make_dataset(str(old), batch_size=1000)) == N  # strings still read


def test_ranked_keeps_the_carried_order_and_refuses_to_pass_the_limit():
    table = pa.table({"value": pa.array([b"b", b"c", b"a"], pa.large_binary()), "count": [5, 5, 9]})
    assert vocab_stats.ranked(table, 10) == (("a", "c", "b"), "")  # ties: the larger value first
    assert vocab_stats.ranked(table, 10, ("c", "z")) == (("c", "z", "a", "b"), "")
    values, note = vocab_stats.ranked(table, 3, ("c", "z"))
    assert values == ("c", "z") and "2 new values would pass the limit of 3" in note
    lookup = vocab_stats.lookup_of(pa.array([b"a", b"c"], pa.large_binary()))
    assert vocab_stats.ids_of(pa.array([b"c", b"x", b"a", b"c"]), lookup).tolist() == [2, 0, 1, 2]
    counts = vocab_stats.Counts(limit=2)
    counts.add({"f": table})
    assert counts.dropped("f") and counts.table("f") is None  # three distinct values: past the limit


@pytest.mark.parametrize("limit", [40, 400, 5000])
def test_counts_add_up_across_chunks_and_bundles_and_drop_past_the_limit(limit):
    rng = np.random.default_rng(limit)
    truth: collections.Counter = collections.Counter()
    bundles = []
    for _ in range(3):
        bundle = vocab_stats.Counts(limit)
        for _ in range(4):
            words = [b"w%d" % x for x in rng.integers(0, 300, int(rng.integers(0, 200)))]
            words += [b"id-%d" % x for x in rng.integers(0, 10**9, int(rng.integers(0, 40)))]
            truth.update(words)
            bundle.add(vocab_stats.count_chunk([("f", "bytes", pa.array(words, pa.large_binary()))], {"f"}))
        bundles.append(bundle)
    got = vocab_stats.Counts.merge_all(bundles).table("f")
    if len(truth) > limit:
        assert got is None
        return
    assert dict(zip(got.column("value").to_pylist(), got.column("count").to_pylist())) == dict(truth)
    assert got.schema == pa.schema([("value", pa.large_binary()), ("count", pa.int64())])
    ranked = sorted(truth, key=lambda v: (truth[v], v), reverse=True)
    assert vocab_stats.ranked(got, limit) == (tuple(v.decode() for v in ranked), "")


@pytest.mark.parametrize("missing", ["mask", "fill"])
def test_feature_space_of_ids_encodes_each_row_as_that_of_strings_does(dataset, missing):
    import keras

    fs = keras.utils.FeatureSpace
    specs = {"city": fs.string_categorical(), "maybe": fs.string_categorical()}
    on_strings = ingest.feature_space(dataset, features=specs, output_mode="dict", missing=missing)
    on_ids = ingest.feature_space(
        dataset,
        text="ids",
        features={"city": fs.integer_categorical(), "maybe": fs.integer_categorical()},
        output_mode="dict",
        missing=missing,
    )
    (x, _), (y, _) = (
        next(iter(ingest.make_dataset(dataset, batch_size=500, shuffle=False, **kw))) for kw in ({}, {"text": "ids"})
    )
    # `maybe` lacks a value in every 7th row, and "" is none of its values: the mask, where
    # make_dataset does not yield it. Read as ids the missing rows are id 0, out of vocabulary.
    lacked = tf.equal(x["maybe"], b"")
    assert np.asarray(lacked).any() and not np.asarray(y["maybe"])[np.asarray(lacked)].any()
    a = on_strings({"city": x["city"], "maybe": x["maybe"], "maybe_missing": lacked})
    b = on_ids({"city": y["city"], "maybe": y["maybe"], "maybe_missing": lacked})
    assert set(a) == set(b) == {"city", "maybe"} | ({"maybe_missing"} if missing == "mask" else set())
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


@pytest.mark.slow
def test_feature_space_defaults_give_a_many_valued_text_its_recorded_ids(dataset):
    import keras

    # url has 3,000 values, more than one-hot takes: ids for an embedding, the very ids
    # make_dataset(text="ids") gives, whether the space reads strings or ids.
    (x, _), (y, _) = (
        next(iter(ingest.make_dataset(dataset, batch_size=500, shuffle=False, **kw))) for kw in ({}, {"text": "ids"})
    )
    for text, batch in (("strings", x), ("ids", y)):
        space = ingest.feature_space(dataset, features=["url", "city"], text=text)
        assert isinstance(
            space.preprocessors["url"], keras.layers.StringLookup if text == "strings" else keras.layers.IntegerLookup
        )
        out = space({"url": batch["url"], "city": batch["city"]})
        np.testing.assert_array_equal(np.asarray(out["url"])[:, 0], np.asarray(y["url"]))
        assert out["concat"].shape == (500, len(ingest.load_info(dataset).vocabulary("city")) + 1)


def test_feature_space_refuses_a_named_feature_it_cannot_take_saying_why(dataset):
    with pytest.raises(ValueError, match=r"feature 'tags' cannot be in a FeatureSpace: a list .*leave it out"):
        ingest.feature_space(dataset, features=["city", "tags"])
    with pytest.raises(ValueError, match=r"missing must be 'mask' or 'fill', as make_dataset takes it, got 'drop'"):
        ingest.feature_space(dataset, missing="drop")


def _edited_copy(dataset, dst, feature: str, edit, *, metadata=None) -> str:
    """A copy of `dataset` whose vocabulary file of `feature` is `edit(values)` (a JSON value)."""
    shutil.copytree(dataset, dst)
    info = json.loads(open(os.path.join(dst, "dataset_info.json")).read())
    file = os.path.join(dst, info["vocabularies"][feature]["file"])
    values = json.loads(open(file).read())
    with open(file, "w") as f:
        json.dump(edit(values), f)
    if metadata is not None:
        metadata(info)
        with open(os.path.join(dst, "dataset_info.json"), "w") as f:
            json.dump(info, f)
    return str(dst)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda v: [v[1], v[0]] + v[2:], r"its SHA-256 is not the one dataset_info\.json records: it was changed"),
        (lambda v: v[:-1] + [v[0]], r"it lists 'w0' twice \(values 0 and \d+\): each value must have one id"),
        (lambda v: [3] + v[1:], r"its value 0 is an integer 3, not a string"),
        (lambda v: v[:-1], r"it holds \d+ values, where dataset_info\.json records \d+"),
        (lambda v: {"values": v}, r"it holds an object .*, not a JSON list of strings"),
    ],
    ids=["reordered", "duplicated", "retyped", "shortened", "not_a_list"],
)
def test_a_vocabulary_file_changed_since_the_conversion_is_refused_naming_it(dataset, tmp_path, edit, why):
    # A reordered file gave every id another value, silently; a duplicated one two ids to a value.
    edited = _edited_copy(dataset, tmp_path / "ds", "city", edit)
    file = r"ds/vocabularies/\d+\.json, the vocabulary of feature 'city', is not the one converted: "
    with pytest.raises(ingest.DatasetInfoError, match=file + why + r".*Restore it"):
        ingest.load_info(edited).vocabulary("city")
    with pytest.raises(ingest.DatasetInfoError, match=file + why):
        ingest.make_dataset(edited, batch_size=10, text="ids", features=["id", "city"])
    table = _table(2)
    pq.write_table(table, tmp_path / "day2.parquet")
    with pytest.raises(
        ConversionError,
        match=r"--schema_from .*ds: its vocabulary file .*vocabularies/\d+\.json, of "
        r"feature 'city', is not the one converted: " + why,
    ):
        run_convert(
            "--source",
            "parquet",
            "--input",
            tmp_path / "day2.parquet",
            "--output",
            tmp_path / "day2",
            "--schema_from",
            edited,
        )
    assert ingest.load_info(edited).vocabulary("tags")  # the others still read


def test_a_vocabulary_without_a_recorded_checksum_reads_as_before_with_the_other_checks(dataset, tmp_path):
    def unrecorded(info):
        for v in info["vocabularies"].values():
            del v["sha256"]

    old = _edited_copy(dataset, tmp_path / "old", "city", lambda v: v, metadata=unrecorded)
    assert ingest.load_info(old).vocabulary("city") == ingest.load_info(dataset).vocabulary("city")
    dup = _edited_copy(dataset, tmp_path / "dup", "city", lambda v: v[:-1] + [v[0]], metadata=unrecorded)
    with pytest.raises(ingest.DatasetInfoError, match=r"it lists 'w0' twice"):
        ingest.load_info(dup).vocabulary("city")


def test_ids_outside_the_vocabulary_in_a_block_are_refused_as_out_of_range_codes_are(dataset):
    from ingest.pipeline.blocks.parse import parse_blocks

    info = ingest.load_info(dataset)
    shard = os.path.join(dataset, info.split("train").shards[0].filename)
    block = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(shard))).numpy())
    features = [info.feature("id"), info.feature("city")]
    size = info.vocabularies["city"]["size"]
    good = parse_blocks(tf.constant([block.SerializeToString()]), features, codes=True, ids={"city": size})
    assert int(tf.reduce_max(good["city"])) <= size
    for bad in (size + 1, -1):
        block.features.feature["city/ids"].int64_list.value[-1] = bad
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=rf"block feature `city/ids` holds the id {bad} for a vocabulary of {size} values \(block 0 ",
        ):
            parse_blocks(tf.constant([block.SerializeToString()]), features, codes=True, ids={"city": size})


def test_the_vocabulary_is_the_one_keras_stringlookup_adapt_learns_ties_included(tmp_path):
    # Ties were ordered by the smaller value first, unlike Keras and the statistics' top.
    import keras

    rng = np.random.default_rng(3)
    words = ["b", "a", "c", "é", "B", "aa", "ab", "z"]
    column = [words[int(i)] for i in rng.integers(0, len(words), 64)] + ["tie1", "tie2", "tie0", "tie2", "tie1", "tie0"]
    info = ingest.load_info(convert_table(tmp_path, pa.table({"w": column})))
    assert len(set(collections.Counter(column).values())) < len(set(column))  # there are ties
    lookup = keras.layers.StringLookup()
    lookup.adapt(tf.constant(column))
    assert list(info.vocabulary("w")) == lookup.get_vocabulary()[1:]  # [1:]: Keras' [UNK], id 0
    top = [v.value for v in info.statistics.feature("w").top]
    assert top == list(info.vocabulary("w"))
