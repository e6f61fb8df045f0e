"""The block layout's parser: N serialized block records -> the columns of all their rows.

A block (docs/block_format.md) is one `tf.train.Example` holding `n` consecutive rows,
each column one packed list. One `parse_example` call reads a whole window of blocks;
the per-block lists are then cut into rows with a few vector ops, no loop over blocks,
so the function works eagerly, in `tf.function` and in `tf.data` maps.

Each block's lengths are checked against its `__rows__` before its values are used: a
block whose lists do not add up would otherwise shift every later row of the window
into the wrong record, silently.

A bytes column's values are its block's dictionary indexed by `F/codes` (format 3); a
block without codes (written before) holds them in `F` itself. Strings are made last,
by one gather from the window's dictionaries after the rows are put in order: a
permutation then moves 8-byte codes, not strings (a string costs ~4x an int64 to copy).
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import tensorflow as tf

from ingest import contract

__all__ = ["ROWS_FEATURE", "check_blocks", "format_message", "parse_blocks", "permute_rows", "as_float64"]

ROWS_FEATURE = contract.BLOCK_ROWS_FEATURE
ROW_LENGTHS_SUFFIX = contract.ROW_LENGTHS_SUFFIX
MISSING_SUFFIX = contract.MISSING_SUFFIX
CODES_SUFFIX = contract.CODES_SUFFIX
IDS_SUFFIX = contract.IDS_SUFFIX

# float64 is parsed as the int64 bit patterns it is stored as (`as_float64`).
_TF_DTYPES = {"int64": tf.int64, "float32": tf.float32, "float64": tf.int64, "bytes": tf.string}


def as_float64(column):
    """A float64 feature's parsed bit patterns (int64, dense or ragged) -> its values."""
    if isinstance(column, tf.RaggedTensor):
        return column.with_flat_values(tf.bitcast(column.flat_values, tf.float64))
    return tf.bitcast(column, tf.float64)


def _ragged(dtype) -> tf.io.RaggedFeature:
    # RaggedFeature, not VarLenFeature: the parser hands back each block's value count as
    # row_splits directly, without the [values, 2] index matrix a SparseTensor carries.
    return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)


def _coded(f: contract.FeatureSpec, codes: bool | None) -> bool:
    return f.dtype == "bytes" and codes is not False


def _parse_spec(
    features: Sequence[contract.FeatureSpec], presence: Collection[str], codes: bool | None, ids: frozenset
) -> dict:
    spec = {ROWS_FEATURE: tf.io.FixedLenFeature([1], tf.int64)}
    for f in features:
        if f.name in ids:  # its dictionary's ids, not its strings (never parsed)
            spec[f.name + IDS_SUFFIX] = _ragged(tf.int64)
        else:
            spec[f.name] = _ragged(_TF_DTYPES[f.dtype])
        if _coded(f, codes):
            spec[f.name + CODES_SUFFIX] = _ragged(tf.int64)
        if f.is_variable_length:
            spec[f.name + ROW_LENGTHS_SUFFIX] = _ragged(tf.int64)
        if f.name in presence:
            spec[f.name + MISSING_SUFFIX] = _ragged(tf.int64)
    return spec


def check_blocks(ok_per_block: tf.Tensor, message) -> tf.Operation:
    """An assert that fails when some block is not ok; `message(i)` describes bad block `i`.

    The message is only built on failure (inside the cond): a good window pays for the
    comparison, a reduce_all and an Assert per check.
    """
    ok = tf.reduce_all(ok_per_block)

    def describe():
        first_bad = tf.argmax(tf.cast(tf.logical_not(ok_per_block), tf.int32), output_type=tf.int64)
        return message(first_bad)

    return tf.debugging.Assert(ok, [tf.cond(ok, lambda: tf.constant(""), describe)])


def located_in(shards, positions):
    """A parse_blocks `locate` naming each block by its shard and its position there."""
    return lambda i, _: ["(block ", _at(positions, i), " of shard ", _at(shards, i), ")"]


def check_rows(got, want, shards, positions) -> tf.Operation:
    """Fails naming the first block whose `__rows__` differ from what the metadata gives it."""
    return check_blocks(
        tf.equal(got, want),
        lambda i: format_message(
            ["block ", _at(positions, i), " of shard ", _at(shards, i), " holds ", _at(got, i)]
            + [" rows, its metadata says ", _at(want, i)]
            + [f". The shard was replaced after conversion, or {contract.METADATA_FILENAME} comes from another "]
            + ["conversion. Reconvert the dataset."]
        ),
    )


def _at(values: tf.Tensor, i) -> tf.Tensor:
    """values[i] for a scalar tensor i, as a gather: 2 ops where the slice makes 7, at a
    quarter of its tracing time. The messages below index a dozen times each, and their
    ops were a third of make_dataset's build (5 columns: 0.63 s, 0.44 s without them)."""
    return tf.gather(values, i)


def _row_of(row_splits: tf.Tensor, j) -> tf.Tensor:
    """The row holding value j of a ragged tensor with these row splits (value_rowids makes
    ~20 ops for it)."""
    return tf.searchsorted(row_splits, tf.reshape(j, [1]), side="right")[0] - 1


def _where_parsed(i, per_block: tf.Tensor) -> list:
    return ["(block ", i, " of the ", tf.size(per_block, out_type=tf.int64), " parsed together)"]


_SLOT = "\x01"  # tf.strings.format's placeholder: no message holds it


def format_message(parts: list) -> tf.Tensor:
    """Python strings and scalar tensors (numbers or strings) joined into one message.

    Text and numbers between two string tensors are one StringFormat op, the text in its
    template: an AsString a number and a Const a piece of text were a fifth of a window
    function's ops, all in messages that run only on failure. (StringFormat would quote a
    string tensor: those are joined as they are.)
    """
    pieces, template, numbers = [], "", []

    def flush():
        if template:
            pieces.append(tf.strings.format(template, numbers, placeholder=_SLOT) if numbers else template)

    for p in parts:
        if isinstance(p, str):
            template += p
        elif p.dtype == tf.string:
            flush()
            pieces.append(p)
            template, numbers = "", []
        else:
            template, numbers = template + _SLOT, numbers + [p]
    flush()
    return pieces[0] if len(pieces) == 1 and not isinstance(pieces[0], str) else tf.strings.join(pieces)


def _counts_check(features: Sequence[contract.FeatureSpec], lists_of: Mapping, coded, rows_per_block, where):
    """One check that each block holds as many values as its rows need, for every list that
    its row count fixes: scalars (one per row), fixed-length lists (k per row) and the row
    lengths of variable-length ones (one per row). `lists_of` maps a block feature's name
    to its parsed [blocks, None] list, and the names in `coded` to their codes.

    One check for all of them, not one per feature: every op of a tf.data function costs
    time each time an iterator is made (~0.25 ms apiece here), and per-feature checks were
    most of a 21-column window parser.
    """
    lists = []  # (key in lists_of, name in the block, values per row, what it holds, how the rows are said)
    for f in features:
        said = f.name + CODES_SUFFIX if f.name in coded else f.name
        if f.is_scalar:
            lists.append((f.name, said, 1, "values", " rows"))
        elif not f.is_variable_length:
            (k,) = f.shape
            lists.append((f.name, said, k, "values", f" rows of {k}"))
        else:
            lists.append((f.name + ROW_LENGTHS_SUFFIX, f.name + ROW_LENGTHS_SUFFIX, 1, "lengths", " rows"))
    if not lists:
        return tf.no_op()
    names, widths, units, rows_said = (tf.constant(list(column)) for column in list(zip(*lists))[1:])
    splits = tf.stack([lists_of[key].row_splits for key, *_ in lists])  # [lists, blocks + 1]
    held = tf.reshape(splits[:, 1:] - splits[:, :-1], [-1])
    expected = tf.reshape(tf.cast(widths, tf.int64)[:, None] * rows_per_block[None, :], [-1])
    blocks = tf.size(rows_per_block, out_type=tf.int64)

    def message(i):
        which, block = i // blocks, i % blocks
        return format_message(
            ["block feature `", _at(names, which), "` holds ", _at(held, i), " ", _at(units, which), " for "]
            + [_at(rows_per_block, block), _at(rows_said, which), " "]
            + where(block, rows_per_block)
        )

    return check_blocks(tf.equal(held, expected), message)


def _local_codes(coded: Sequence[contract.FeatureSpec], parsed: Mapping, dictionaries_of, every_block: bool) -> dict:
    """The bytes columns' codes, {name: [blocks, None] int64}, each an index into its block's
    dictionary.

    `every_block`: every block carries `F/codes` (format 3). Else a block without them
    holds its values in its dictionary in order (format 4: all distinct; before 3: plain
    values), as if its codes were 0 ... n-1.
    """
    codes = {f.name: parsed[f.name + CODES_SUFFIX] for f in coded}
    if every_block or not coded:
        return codes
    names = list(codes)
    have = tf.concat([codes[n].row_lengths() for n in names], 0)  # [columns x blocks]
    sizes = tf.concat([dictionaries_of[n].row_lengths() for n in names], 0)
    # One cond for all columns, taken only when some block left its codes out: building
    # them costs a copy of every code (the low-cardinality corpus' 80-block window parsed
    # in 16.1 ms with it, 15.1 without). A cond a column traced ~0.1 s each in a fresh
    # process (5 text columns: a third of make_dataset's build).
    return tf.cond(
        tf.reduce_any(tf.logical_and(tf.equal(have, 0), sizes > 0)),
        lambda: _with_implied_codes(codes, have, sizes),
        lambda: dict(codes),
    )


def _with_implied_codes(codes_of: Mapping, have: tf.Tensor, sizes: tf.Tensor) -> dict:
    """Each block's codes, 0 ... n-1 for a block of n dictionary values that has none.

    `have` and `sizes` are each column's blocks' code and dictionary counts, the columns in
    `codes_of`'s order one after another. All columns at once, by dense ops (each value's
    block, its place in it, one gather), not a ragged concat of a ragged range a column:
    5 text columns' branch held 350 ops made a column at a time.
    """
    splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(tf.where(have > 0, have, sizes))], 0)
    block = _segment_ids(splits, splits[-1])
    place = tf.range(splits[-1]) - tf.gather(splits, block)
    given = tf.gather(have, block) > 0
    codes = tf.concat([c.values for c in codes_of.values()] + [tf.zeros([1], tf.int64)], 0)
    # Where the given codes start: each block's start among all columns' codes. The implied
    # places gather the 0 put after them (there may be no codes at all).
    starts = tf.cumsum(have, exclusive=True)
    at = tf.where(given, tf.gather(starts, block) + place, tf.size(codes, out_type=tf.int64) - 1)
    values = tf.where(given, tf.gather(codes, at), place)
    columns = len(codes_of)
    lengths = tf.reshape(splits[1:] - splits[:-1], [columns, tf.size(have) // columns])
    parts = tf.split(values, tf.reduce_sum(lengths, 1), num=columns)
    return {
        name: tf.RaggedTensor.from_row_lengths(part, lengths[i], validate=False)
        for i, (name, part) in enumerate(zip(codes_of, parts))
    }


def _segment_ids(splits: tf.Tensor, total) -> tf.Tensor:
    """Row splits [N + 1] of `total` values -> each value's row: a scatter and a cumsum.

    tf.repeat and RaggedTensor.value_rowids take ~20 ops each, and every op of a tf.data
    function costs time whenever an iterator is made.
    """
    inner = splits[1:-1]  # a split at `total` (empty rows at the end) lands past the values
    marks = tf.scatter_nd(tf.expand_dims(inner, 1), tf.ones_like(inner), tf.reshape(total + 1, [1]))
    return tf.cumsum(marks[:total])


def _global_codes(
    coded: Sequence[contract.FeatureSpec], dictionaries_of, local, rows_per_block, block_ends, total_rows, where
):
    """The bytes columns' codes made indexes into the window's dictionaries (block after
    block), and one check that every code falls in its own block's dictionary.

    Scalar and fixed-length columns share their values' rows (checked by the counts check
    this runs after); variable-length ones find theirs. `block_ends` (each block's end, in
    rows) and `total_rows` are parse_blocks'; `dictionaries_of[name]` is each block's
    dictionary (its strings, or its ids in the vocabulary).
    """
    if not coded:
        return {}, tf.no_op()
    row_block = _segment_ids(tf.concat([[0], block_ends], 0), total_rows)
    shared = {}
    out, oks, blocks_of = {}, [], []
    for f in coded:
        codes = local[f.name]
        if f.is_variable_length:
            block_of = _segment_ids(codes.row_splits, tf.size(codes.values, out_type=tf.int64))
        elif f.is_scalar:
            block_of = row_block
        else:
            (k,) = f.shape
            if k not in shared:
                shared[k] = tf.reshape(tf.tile(tf.expand_dims(row_block, 1), [1, k]), [-1])
            block_of = shared[k]
        dictionaries = dictionaries_of[f.name]
        size_of = tf.gather(dictionaries.row_lengths(), block_of)
        # One unsigned comparison checks both bounds: a negative code wraps to a huge one.
        oks.append(tf.bitcast(codes.values, tf.uint64) < tf.bitcast(size_of, tf.uint64))
        blocks_of.append(block_of)
        out[f.name] = codes.with_values(codes.values + tf.gather(dictionaries.row_splits, block_of))
    names = tf.constant([f.name + CODES_SUFFIX for f in coded])

    def message(c):
        # Built only on failure: the first bad value is in the first column with one.
        j = tf.argmax(tf.cast(tf.logical_not(tf.concat(oks, 0)), tf.int32), output_type=tf.int64)
        block = _at(tf.concat(blocks_of, 0), j)
        code = _at(tf.concat([local[f.name].values for f in coded], 0), j)
        size = _at(
            tf.concat([dictionaries_of[f.name].row_lengths() for f in coded], 0),
            c * tf.size(rows_per_block, tf.int64) + block,
        )
        return format_message(
            ["block feature `", _at(names, c), "` holds the code ", code, " for a dictionary of ", size, " values "]
            + where(block, rows_per_block)
        )

    return out, check_blocks(tf.stack([tf.reduce_all(ok) for ok in oks]), message)


def _ids_check(sizes: Mapping, dictionaries_of, rows_per_block, where) -> tf.Operation:
    """One check that every block's `F/ids` lie in [0, the vocabulary's size] (0: out of
    it): an id past it would be read as no value, or as another's in a larger vocabulary.
    One unsigned comparison per dictionary entry, not per row."""
    names = sorted(sizes)
    oks = [
        tf.reduce_all(
            dictionaries_of[n].with_values(
                tf.bitcast(dictionaries_of[n].values, tf.uint64) <= tf.constant(sizes[n], tf.uint64)
            ),
            axis=1,
        )
        for n in names
    ]
    ok_per_block = tf.reduce_all(tf.stack(oks), axis=0)

    def message(block):
        # Built only on failure: the first column whose ids in this block are out of range.
        c = tf.argmax(tf.cast(tf.logical_not(tf.stack([ok[block] for ok in oks])), tf.int32), output_type=tf.int32)
        branches = [lambda n=n: _first_out_of_range(dictionaries_of[n][block], sizes[n]) for n in names]
        return format_message(
            ["block feature `", tf.gather(tf.constant([n + IDS_SUFFIX for n in names]), c), "` holds the id "]
            + [tf.switch_case(c, branches), " for a vocabulary of "]
            + [tf.gather(tf.constant([sizes[n] for n in names], tf.int64), c), " values "]
            + where(block, rows_per_block)
        )

    return check_blocks(ok_per_block, message)


def _first_out_of_range(ids: tf.Tensor, size: int) -> tf.Tensor:
    bad = tf.logical_not(tf.bitcast(ids, tf.uint64) <= tf.constant(size, tf.uint64))
    return tf.gather(ids, tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64))


def _column(f: contract.FeatureSpec, values: tf.RaggedTensor, parsed: Mapping, total_rows: tf.Tensor, where):
    """One feature's values (a bytes feature's codes) over all rows: dense [R] or [R, k],
    or ragged [R, None].

    Each block's counts were checked by `_counts_check`; a variable-length list is also
    checked here against its row lengths.
    """
    if f.dtype == "float64":
        values = as_float64(values)  # its stored bit patterns -> its doubles
    if f.is_scalar:
        return values.values
    if not f.is_variable_length:
        (k,) = f.shape
        return tf.reshape(values.values, tf.stack([total_rows, k]))
    name = f.name
    lengths_name = name + ROW_LENGTHS_SUFFIX
    lengths = parsed[lengths_name]
    # Row splits over the whole window; a block is consistent when its rows end exactly
    # where its values do, which compares one number per block instead of every row.
    splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(lengths.values)], axis=0)
    value_ends = tf.gather(splits, lengths.row_splits[1:])
    sum_check = check_blocks(
        tf.equal(value_ends, values.row_splits[1:]),
        lambda i: format_message(
            [f"block feature `{name}` holds ", _at(values.row_lengths(), i)]
            + [f" values but its `{lengths_name}` sum to "]
            + [_at(value_ends, i) - _at(splits, _at(lengths.row_splits, i)), " "]
            + where(i, value_ends)
        ),
    )
    # A negative length could still sum right and would make the row splits go backwards.
    sign_check = check_blocks(
        lengths.values >= 0,
        lambda j: format_message(
            [f"block feature `{lengths_name}` holds the negative length ", _at(lengths.values, j), " "]
            + where(_row_of(lengths.row_splits, j), value_ends)
        ),
    )
    with tf.control_dependencies([sum_check, sign_check]):
        return tf.RaggedTensor.from_row_splits(values.values, tf.identity(splits), validate=False)


def _missing_rows(f: contract.FeatureSpec, parsed: Mapping, rows_per_block, block_starts, where) -> tf.Tensor:
    """The rows (in the N blocks' order) that the blocks' `F/missing` lists name, checked."""
    missing = parsed[f.name + MISSING_SUFFIX]
    block_of = missing.value_rowids()
    rows_of_block = tf.gather(rows_per_block, block_of)
    in_range = tf.logical_and(missing.values >= 0, missing.values < rows_of_block)
    name = f.name + MISSING_SUFFIX
    check = check_blocks(
        in_range,
        lambda j: format_message(
            [f"block feature `{name}` names row ", _at(missing.values, j), " of a block of ", _at(rows_of_block, j)]
            + [" rows "]
            + where(_at(block_of, j), rows_per_block)
        ),
    )
    with tf.control_dependencies([check]):
        return missing.values + tf.gather(block_starts, block_of)


def _missing_matrix(features, parsed: Mapping, rows_per_block, block_starts, total_rows, where) -> tf.Tensor:
    """[R, F] bool: True at the rows each of the F features' `F/missing` lists name.

    One scatter for all F, and (by `_missing_columns`) one gather of its rows for a permutation:
    a scatter and a gather per feature cost the seekable order ~18% of its rows/s at
    4096 with 10 masks (21 columns, a tenth of their values missing)."""
    k = len(features)
    rows = [_missing_rows(f, parsed, rows_per_block, block_starts, where) * k + i for i, f in enumerate(features)]
    flat = tf.concat(rows, 0)
    marked = tf.scatter_nd(flat[:, None], tf.ones_like(flat, dtype=tf.int32), tf.reshape(total_rows * k, [1]))
    return tf.reshape(tf.not_equal(marked, 0), [-1, k])


def _missing_columns(features, take, parsed, rows_per_block, block_starts, total_rows, where) -> dict:
    """{feature: [R] bool, True at the rows its `F/missing` lists} for `features`, their rows
    `take`n (a `_rows_taken`, or None)."""
    if not features:
        return {}
    matrix = _missing_matrix(features, parsed, rows_per_block, block_starts, total_rows, where)
    if take is not None:
        matrix = take(matrix)
    return dict(zip((f.name for f in features), tf.unstack(matrix, axis=1)))


def parse_blocks(
    serialized: tf.Tensor,
    features: Sequence[contract.FeatureSpec],
    *,
    with_presence: bool = False,
    with_block_rows: bool = False,
    locate=None,
    codes: bool | None = None,
    take=None,
    row_check=None,
    ids: Mapping | frozenset = frozenset(),
    masks: Mapping | None = None,
):
    """N serialized blocks (a [N] string tensor) -> {name: all rows of the N blocks, in order}.

    Scalars come back dense [R], fixed-length lists dense [R, k], variable-length lists as
    a RaggedTensor [R, None] with int64 row_splits; R is the sum of the blocks' `__rows__`.
    Missing values are already the column default in the blocks (the writer puts them
    there). With `with_presence=True`, returns `(values, presence)` where `presence[name]`
    is a [R] bool tensor, False at the rows the blocks list in `F/missing`; `masks`
    ({feature: a name}) adds its negation to the values under that name, for those named.
    With `with_block_rows=True`, the [N] int64 rows of each block (`__rows__`) come last.

    `codes`: whether the blocks' bytes columns carry `F/codes`: True for format 3, False
    before, None when each block says (spans converted by both).

    `ids`: the bytes columns to return as int64 ids of their vocabulary (`F/ids`, format
    4), their strings never parsed; they need `codes` True. A mapping gives each one's
    vocabulary size: an id outside [0, size] is an error naming the block, as a code
    outside its dictionary is.

    `take` ([T] int64 row numbers) returns those rows, in that order, instead of all (and
    their presence): a permutation moves codes before the strings are made.
    `row_check(rows_per_block)` is an assert that runs before any column is built.

    A block whose lists do not match its row count raises `tf.errors.InvalidArgumentError`
    naming the feature and the block: `locate(i, rows_per_block)` gives the words that
    say where block i is (a list of strings and scalar tensors), by default its position
    among the N.
    """
    masks = masks or {}
    listed = [f for f in features if with_presence or f.name in masks]  # their `F/missing` parsed
    parsed = tf.io.parse_example(serialized, _parse_spec(features, {f.name for f in listed}, codes, ids))
    # Each bytes column's block dictionaries: of strings, or of ids for those read as ids.
    dictionaries_of = {f.name: parsed[f.name + IDS_SUFFIX if f.name in ids else f.name] for f in features}
    rows_per_block = parsed[ROWS_FEATURE][:, 0]
    block_ends = tf.cumsum(rows_per_block)
    block_starts = block_ends - rows_per_block
    total_rows = tf.reduce_sum(rows_per_block)
    where = locate or _where_parsed
    coded = [f for f in features if _coded(f, codes)]
    local = _local_codes(coded, parsed, dictionaries_of, codes is True)
    counts = _counts_check(features, {**parsed, **local}, set(local), rows_per_block, where)
    with tf.control_dependencies([counts]):  # a short list is named as such, not as a bad code
        values_of, codes_check = _global_codes(
            coded, dictionaries_of, local, rows_per_block, block_ends, total_rows, where
        )
    checks = [counts, codes_check]
    if isinstance(ids, Mapping) and ids:
        checks.append(_ids_check(ids, dictionaries_of, rows_per_block, where))
    if row_check is not None:
        checks.append(row_check(rows_per_block))
    with tf.control_dependencies(checks):
        total_rows = tf.identity(total_rows)
        values = {
            f.name: tf.identity(_column(f, values_of.get(f.name, dictionaries_of[f.name]), parsed, total_rows, where))
            for f in features
        }
    if take is not None:
        take = _rows_taken(take)
        values = {name: take(column) for name, column in values.items()}
    missing = _missing_columns(listed, take, parsed, rows_per_block, block_starts, total_rows, where)
    values.update({mask: missing[name] for name, mask in masks.items()})
    values = {name: _strings(dictionaries_of[name].values, v) if name in values_of else v for name, v in values.items()}
    out = (values,)
    if with_presence:
        out += ({name: tf.logical_not(m) for name, m in missing.items()},)
    if with_block_rows:
        out += (rows_per_block,)
    return out[0] if len(out) == 1 else out


def _rows_taken(take):
    """column -> its rows `take`, in that order.

    gather_nd, not gather, for dense columns: its kernel copies a row ~20% faster for
    numbers and ~35% faster for strings (TF 2.21, 80k-row windows), and a window's
    permutation is most of its copying.
    """
    at = tf.expand_dims(take, 1)

    def rows(column):
        if isinstance(column, tf.RaggedTensor):
            return tf.gather(column, take)
        return tf.gather_nd(column, at)

    return rows


def _strings(dictionaries: tf.Tensor, column):
    """A bytes column's codes (dense or ragged) -> its values: strings, or their ids."""
    if isinstance(column, tf.RaggedTensor):
        return column.with_flat_values(_strings(dictionaries, column.flat_values))
    return tf.gather_nd(dictionaries, tf.expand_dims(column, -1))


def _row_count(column) -> tf.Tensor:
    if isinstance(column, tf.RaggedTensor):
        return column.nrows(out_type=tf.int32)
    return tf.shape(column, out_type=tf.int32)[0]


def permute_rows(rows: Mapping, seed) -> dict:
    """The same random permutation of rows applied to every column of `rows`.

    `rows` maps names to dense tensors or RaggedTensors that share their first dimension
    (a parsed window; merge the presence dict in under other names to permute it along).
    `seed` is a shape [2] int32/int64 tensor for a stateless, reproducible permutation,
    or None for a fresh one from the global generator.
    """
    if not rows:
        return {}
    order = tf.range(_row_count(next(iter(rows.values()))))
    if seed is None:
        order = tf.random.shuffle(order)
    else:
        order = tf.random.experimental.stateless_shuffle(order, seed=seed)
    take = _rows_taken(order)
    return {name: take(column) for name, column in rows.items()}
