"""Iterators of the seekable order that checkpoint their position, not tf.data's state.

    tf.train.Checkpoint(iterator=it).write          restore (a fresh process, the same call)
    --------------------------------------          ------------------------------------------
    it: _Iterator over make_dataset's dataset       checks the fingerprint (and a given seed)
      its start (seed, pass, first batch) read      in Python: a checkpoint of another
      from the order's `started` after its first    dataset is refused in ingest's words
      batch; the batches it hands out counted       arms the order's Resume with (seed, pass,
      (eagerly in Python, in a tf.function by an    batch) and re-makes the iterator: its
      assign to its variable)                       first batch reads the armed start (once)
    -> [version, fingerprint, seed, pass, batch]    -> the exact next batch
       five int64 (under a kilobyte on disk)

tf.data's own symbolic checkpoints cost the seekable order a third to a half of its rate
on 2 cores (BENCHMARKS.md, #45): every element of every stage carries its position. The
order is a pure function of (seed, pass, batch), so that is all a checkpoint needs. The
iterator is made by `iter()` on make_dataset's dataset, or on a `map` (deterministic),
`prefetch` or `with_options` of it: a stage that gives one element per element keeps the
position. Past any other stage (batch, filter, take, shuffle...) the iterator is
tf.data's, and its checkpoint holds the buffers in flight (`ReadOptions(
symbolic_checkpoint=True)` gives tf.data's symbolic checkpoints there instead).

Passed to a tf.function (as Keras and custom loops pass it), the iterator keeps its
class: its type spec carries its count's variable as a component, so a traced step
counts into the iterator it was called with.

The order's Resume is one per dataset: a restore arms it and the next iterator of that
dataset to make its first batch takes the start. Each iterator checks the start it reads
back: one start since it last looked, carrying the token of its own restore (0 if none).
Two iterators restored or started at once over one dataset raise instead of swapping
positions. In a tf.function a batch costs one assign; the start is read in Python, once
(reading it in the graph too cost ~5 us a batch here: BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
import re

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, iterator_ops
from tensorflow.python.framework import tensor as tensor_lib
from tensorflow.python.ops import gen_dataset_ops, gen_resource_variable_ops

__all__ = ["MARK", "Resume", "one_line", "restorable"]

# Every restore check's message starts so (ingest/pipeline/blocks/seekable.py).
MARK = "this iterator was restored from a checkpoint"
_VERSION = 1
_KEY = "position"
_CPU = "/device:CPU:0"
# The order's `started`: the last start (seed, pass, first batch, token) and how many starts so far.
_TOKEN, _STARTS = 3, 4


def one_line(message: str) -> str | None:
    """The restore check's sentence in a TensorFlow error message; None when it holds none.

    An assert's data are printed as "[text] [1] [text]" after "assertion failed: ".
    """
    found = re.search(r"assertion failed: (\[" + re.escape(MARK) + r".*?\])\s*\n", message, re.S)
    if found is None:
        return None
    return " ".join(part.strip() for part in re.findall(r"\[([^\[\]]*)\]", found.group(1)))


class Resume:
    """Where the next iterator of a seekable order starts, when a restore says so.

    `armed` is [token, seed, pass, batch] (token 0: nothing armed); `started` is what the
    last iterator to make its first batch started at, [seed, pass, first batch, token],
    and the count of such starts.
    """

    def __init__(self, *, seed: int, fingerprint: int, given_seed: int | None, other_dataset: str, other_seed):
        self.seed, self.fingerprint, self.given_seed = seed, fingerprint, given_seed
        self.other_dataset, self.other_seed = other_dataset, other_seed  # the refusals' sentences
        with tf.init_scope(), tf.device(_CPU):
            self.armed = tf.Variable([0, 0, 0, 0], dtype=tf.int64, trainable=False, name="ingest_resume_armed")
            self.started = tf.Variable([seed, -1, -1, 0, 0], dtype=tf.int64, trainable=False, name="ingest_started")
        self._tokens = itertools.count(1)

    def start_of(self, drawn_pass, first_batch):
        """In the order's graph, as an iterator makes its first batch: (seed, pass, first batch),
        the armed ones if a restore armed them (and disarmed now), else its own."""
        armed = self.armed.read_value()
        token = armed[0]
        is_armed = token > 0
        seed = tf.where(is_armed, armed[1], tf.constant(self.seed, tf.int64))
        this_pass = tf.where(is_armed, armed[2], drawn_pass)
        first = tf.cond(is_armed, lambda: armed[3], first_batch)
        starts = self.started.read_value()[_STARTS]
        with tf.control_dependencies([armed, starts]):
            done = [
                self.armed.assign(tf.zeros([4], tf.int64)),
                self.started.assign(tf.stack([seed, this_pass, first, token, starts + 1])),
            ]
        with tf.control_dependencies(done):
            return tf.identity(seed), tf.identity(this_pass), tf.identity(first)

    def arm(self, seed: int, this_pass: int, batch: int) -> int:
        token = next(self._tokens)
        self.armed.assign([token, seed, this_pass, batch])
        return token

    def check(self, saved) -> None:
        """Refuses a saved position of another order, in one line."""
        version, fingerprint, seed = (int(x) for x in saved[:3])
        if version != _VERSION:
            raise tf.errors.InvalidArgumentError(
                None,
                None,
                f"{MARK} of another ingest version's iterator (position format {version}, this one reads "
                f"{_VERSION}): start without the checkpoint, with start_batch= from the step it saved",
            )
        if fingerprint != self.fingerprint:
            raise tf.errors.InvalidArgumentError(None, None, self.other_dataset)
        if self.given_seed is not None and seed != self.seed:
            raise tf.errors.InvalidArgumentError(None, None, self.other_seed(seed))


def restorable(ds: tf.data.Dataset, resume: Resume | None = None, restart=None) -> tf.data.Dataset:
    """`ds` (the same graph), whose eager iterators re-raise a restore check's error as one
    line, and with `resume` checkpoint their position. `restart()` gives the graph a
    restored iterator is made over (`ds` without its count of batches)."""
    return _Restorable(ds, resume, restart or (lambda: ds))


class _Restorable(dataset_ops.UnaryUnchangedStructureDataset):
    def __init__(self, input_dataset: tf.data.Dataset, resume: Resume | None, restart):
        self._input_dataset, self._resume, self._restart, self._restarted = input_dataset, resume, restart, None
        super().__init__(input_dataset, input_dataset._variant_tensor)

    def __iter__(self):
        if tf.executing_eagerly() and not tf.inside_function():
            return _Iterator(dataset=self, resume=self._resume)
        return super().__iter__()

    def restarted(self) -> tf.data.Dataset:
        """The graph a restored iterator runs: built at the first restore, then kept."""
        if self._restarted is None:
            self._restarted = self._restart()
        return self._restarted

    def _derived(self, ds: tf.data.Dataset, keeps: bool, again) -> _Restorable:
        """A stage over this one: it keeps the position if it gives one element per element
        in order (`keeps`); `again(graph)` makes it over the restarted graph."""
        resume = self._resume if keeps else None
        return _Restorable(ds, resume, lambda: again(self.restarted()))

    # Stages that give one element per element keep the position (see the module docstring).
    def map(self, map_func, *args, **kwargs):
        deterministic = kwargs.get("deterministic", args[1] if len(args) > 1 else None)
        ds = super().map(map_func, *args, **kwargs)
        return self._derived(ds, deterministic is not False, lambda base: base.map(map_func, *args, **kwargs))

    def prefetch(self, buffer_size, name=None):
        ds = super().prefetch(buffer_size, name=name)
        return self._derived(ds, True, lambda base: base.prefetch(buffer_size, name=name))

    def with_options(self, options, name=None):
        ds = super().with_options(options, name=name)
        return self._derived(ds, True, lambda base: base.with_options(options, name=name))


class _PositionSpec(iterator_ops.IteratorSpec):
    """An _Iterator's type: the iterator's resource and its count's variable, so a
    tf.function traced with one iterator counts into whichever it is called with."""

    __slots__ = ["_resume"]

    def __init__(self, element_spec, resume: Resume):
        super().__init__(element_spec)
        self._resume = resume

    @property
    def value_type(self):
        return _Iterator

    def _serialize(self):
        return (self._element_spec, "ingest-position")

    @property
    def _component_specs(self):
        return (tensor_lib.TensorSpec([], tf.resource),) * 2

    def _to_components(self, value):
        value._before_a_call()
        return (value._iterator_resource, value._taken_handle)

    def _from_components(self, components):
        return _Iterator(components=components, element_spec=self._element_spec, resume=self._resume)

    @staticmethod
    def from_value(value):
        return _PositionSpec(value.element_spec, value._resume)


class _Iterator(iterator_ops.OwnedIterator):
    """Counts the batches it hands out; its start (the head: seed, pass, first batch, token)
    is read from the Resume's `started` after its first batch, in Python."""

    def __init__(self, dataset=None, components=None, element_spec=None, resume: Resume | None = None):
        self._resume, self._taken = resume, None
        if components is not None and resume is not None:  # rebuilt in a tf.function from its spec
            components, self._taken_handle = (components[0],), components[1]
        super().__init__(dataset=dataset, components=components, element_spec=element_spec)
        self._restorable = dataset
        if dataset is not None and resume is not None:
            with tf.init_scope(), tf.device(_CPU):
                self._taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="ingest_batches_taken")
            self._taken_handle = self._taken.handle
            self._fresh(token=0)

    def _fresh(self, token: int) -> None:
        """No batch taken yet: the start is still to come, from the next one."""
        self._head, self._token, self._eager_taken = None, token, 0
        self._taken.assign(0)
        self._starts_before = self._starts()  # how many iterators started before this one's first batch

    def _starts(self) -> int:
        return int(self._resume.started[_STARTS].numpy())

    @property
    def _type_spec(self):
        if self._resume is None:
            return super()._type_spec
        return _PositionSpec(self.element_spec, self._resume)

    def __next__(self):
        try:
            return super().__next__()
        except tf.errors.OpError as e:
            _reraise(e)

    def _next_internal(self):
        if self._resume is None:
            return super()._next_internal()
        if tf.executing_eagerly() and self._head is None and not self._took_any():
            self._starts_before = self._starts()
        element = super()._next_internal()
        self._count(element, None)
        return element

    def get_next_as_optional(self):
        optional = super().get_next_as_optional()
        if self._resume is not None:
            self._count(optional, optional.has_value())
        return optional

    # -- the position ----------------------------------------------------------------------

    def _count(self, element, has_value) -> None:
        """One batch taken (if `has_value`): in Python when eager, by one assign in a tf.function."""
        if tf.executing_eagerly():
            if has_value is not None and not bool(has_value):
                return
            self._eager_taken += 1
            if self._head is None:
                self._take_head()
            return
        deps = [t for t in tf.nest.flatten(element, expand_composites=True) if isinstance(t, tf.Tensor)]
        one = tf.constant(1, tf.int64) if has_value is None else tf.cast(has_value, tf.int64)
        with tf.control_dependencies(deps):
            gen_resource_variable_ops.assign_add_variable_op(self._taken_handle, one)

    def _took_any(self) -> bool:
        return bool(self._eager_taken) or int(self._taken.numpy()) > 0

    def _take_head(self) -> None:
        """After the first batch (taken eagerly, or in a tf.function since the last look): the
        start it got, checked to be its own: one start since it looked, with its token."""
        started = self._resume.started.numpy().tolist()
        if started[_STARTS] != self._starts_before + 1 or started[_TOKEN] != self._token:
            raise RuntimeError(
                "two iterators over one make_dataset dataset were restored or started at once, so "
                "this one cannot tell its position (and one may have taken the other's checkpointed "
                "start): restore an iterator, or make one, and take its first batch before restoring "
                "or starting another over the same dataset"
            )
        self._head = started[:_STARTS]

    def _before_a_call(self) -> None:
        """As the iterator is passed to a tf.function (eagerly, before the call)."""
        if self._taken is None:
            return
        if self._head is None:
            if self._took_any():
                self._take_head()
            else:
                self._starts_before = self._starts()
        self._fold()

    def _fold(self) -> None:
        """Eager batches counted in Python go into the variable."""
        if self._eager_taken and tf.executing_eagerly():
            self._taken.assign_add(self._eager_taken)
            self._eager_taken = 0

    def _serialize_to_tensors(self):
        if self._resume is None:
            return super()._serialize_to_tensors()
        self._before_a_call()
        if self._head is None:  # no batch yet: batch -1, restored as a fresh iterator
            seed, this_pass, batch = self._resume.seed, 0, tf.constant(-1, tf.int64)
        else:
            seed, this_pass, first, _ = self._head
            batch = first + self._taken.read_value()
        constants = tf.constant([_VERSION, self._resume.fingerprint, seed, this_pass], tf.int64)
        return {_KEY: tf.concat([constants, tf.reshape(batch, [1])], 0)}

    def _restore_from_tensors(self, restored_tensors):
        if self._resume is None:
            try:
                return super()._restore_from_tensors(restored_tensors)
            except tf.errors.OpError as e:
                _reraise(e)
        saved = restored_tensors[_KEY].numpy().tolist()
        self._resume.check(saved)
        _, _, seed, this_pass, batch = saved
        if batch < 0 and self._head is None and not self._took_any():
            # Saved before its first batch, restored into an iterator before its first: it
            # starts as the saved one would have (the same pass, drawn by the same graph).
            return []
        token = 0 if batch < 0 else self._resume.arm(seed, this_pass, batch)
        # The same iterator resource made anew: a tf.function that captured it goes on with it.
        gen_dataset_ops.make_iterator(self._restorable.restarted()._variant_tensor, self._iterator_resource)
        self._fresh(token)
        return []


def _reraise(e: tf.errors.OpError):
    line = one_line(e.message)
    if line is None:
        raise e
    raise type(e)(e.node_def, e.op, line) from None
