"""Batches of any number of rows answered by plans of a few sizes: row buckets.

A tabular model or a small MLP scored in batches (a service's requests, or a client's
batch of records) meets a new number of rows with nearly every call once batches pass the
ladder's sizes (``runtime/prepared_forms.py``: every batch from one to 64 is planned and
bound during ``Session.wait_compiled``). Each new size took a plan, its kernels' full routes
and a feed check: a scikit-learn MLP at 65-4,000 rows, a new size every 10 ms, 1.0-1.5 ms a
request against 0.3 for a size it had bound, and onnxruntime's 0.35-0.5 (2026-12-04).

Where every row of every output depends only on the same row of the feeds (a *row-wise*
form), a batch of ``n`` rows past the ladder runs at the smallest bucket ``B >= n`` of a
geometric grid (:data:`STEPS_PER_DOUBLING` buckets to a doubling, so at most ~9% more rows
are computed), its feeds copied into this thread's buffers with the last real row
repeated into the rest, and each output is its first ``n`` rows. A bucket's plan is made
and bound once, and a service's batches settle onto a few dozen steady lanes.

A form is row-wise when its one free axis group is axis 0 of every feed, no node can mix
rows in a way a test might miss (:func:`rows_stay_apart`: no control flow, no random or
sequence operator, no reduction, sort, scan or scatter along axis 0), and a run verifies
it (:func:`verified`): a batch of random rows, run at its own size and inside a bucket
whose other rows are random too, gives the same bits in every row of every output, and
every output has the rows on its axis 0. Only then are a session's buckets used.

The bits: with ``MIXRT_BATCH_INVARIANT=1`` (``mixrt serve`` sets it where it joins requests
into batches) a row's bits do not depend on the rows beside it, and a bucketed request gets
those of a run at its own size. Without, a product's last strip of rows and a softmax's last
block of rows may take another order of sums at another number of rows, so a row near the
end of a request may differ from a direct run in its last bit, as two batch sizes' runs of
that row do anyway (a classifier's 879 rows inside 944: one row, 8e-15 apart); the same
request gets the same bits every time.
"""

from __future__ import annotations

import bisect
import math
import threading

import numpy as np

from mixrt.base import made_up_feeds
from mixrt.base.made_up_feeds import random_array
from mixrt.runtime.feeds import feed_signature

# buckets a doubling of the rows (2^(1/8) apart: at most ~9% more rows computed)
STEPS_PER_DOUBLING = 8
# the feeds' bytes up to which a batch is bucketed (past that a run's kernels are long
# against a new size's planning, and the buffers would hold more memory than they save)
MAX_BUCKET_BYTES = 4 << 20

# operators that may read across rows whatever their attributes: control flow, randomness,
# sequences and maps, and outputs whose shape their values decide
_NEVER = frozenset((
    "If", "Loop", "Scan", "NonZero", "Unique", "Compress", "TopK", "Multinomial",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
    "Dropout", "ZipMap", "CastMap", "DictVectorizer", "SequenceAt", "SequenceConstruct",
    "SequenceInsert", "SequenceEmpty", "SplitToSequence", "ConcatFromSequence",
    "SequenceLength", "SequenceErase", "Optional", "OptionalGetElement", "OptionalHasElement",
    "StringSplit", "RegexFullMatch", "Shape", "Size", "ConstantOfShape", "Range", "Expand",
    "Tile", "Pad", "Slice", "NonMaxSuppression", "RoiAlign", "MaxRoiPool", "Trilu",
    "EyeLike", "GatherND", "ScatterND", "ScatterElements", "Scatter", "GatherElements",
    "Einsum", "Det", "StringConcat", "Col2Im", "CenterCropPad", "DFT", "STFT",
))
# operators along an axis (attribute "axis", ONNX's default) that mix rows at axis 0
_AXIS = {"Softmax": None, "LogSoftmax": None, "Hardmax": None, "ArgMax": 0, "ArgMin": 0,
         "Concat": None, "Split": 0, "Flatten": 1, "LpNormalization": -1,
         "LayerNormalization": -1, "Gather": 0}
_REDUCTIONS = frozenset(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                         "ReduceSumSquare"))


def rows_stay_apart(graph) -> bool:
    """Whether no node of ``graph`` (no subgraphs) reads across rows by its kind or its
    attributes: :data:`_NEVER`'s kinds, an axis of 0 (a Gather of a constant table by the
    rows' indices excepted), reductions over all axes or over axis 0, a Transpose that
    moves axis 0, a BatchNormalization that trains, a Reshape whose shape is not a
    constant. Negative axes are left to :func:`verified` (they are the last axes of
    tensors whose rank is unknown here, and mixing rows there shows in every row)."""
    constants = graph.initializers
    for node in graph.nodes:
        if node.subgraphs() or node.op_type in _NEVER:
            return False
        attributes = node.attributes
        if node.op_type in _AXIS:
            axis = attributes.get("axis", _AXIS[node.op_type])
            if axis == 0 and not (node.op_type == "Gather" and node.inputs[0] in constants):
                return False
        elif node.op_type in _REDUCTIONS:
            axes = attributes.get("axes")
            if axes is None and len(node.inputs) > 1 and node.inputs[1] in constants:
                axes = [int(a) for a in np.asarray(constants[node.inputs[1]]).reshape(-1)]
            if not axes or 0 in axes:
                return False
        elif node.op_type == "Transpose":
            perm = attributes.get("perm")
            if not perm or perm[0] != 0:
                return False
        elif node.op_type == "BatchNormalization" and attributes.get("training_mode"):
            return False
        elif node.op_type == "Reshape" and node.inputs[1] not in constants:
            return False
    return True


def batch_names(signature: tuple, groups: dict) -> tuple | None:
    """The feeds of ``signature`` when its one free axis group (``prepared_forms``'s
    ``_free_groups``) is axis 0 of every one of them, all tensors; else None."""
    if len(groups) != 1:
        return None
    (axes,) = groups.values()
    names = tuple(name for name, _ in signature)
    if sorted(axes) != sorted((name, 0) for name in names):
        return None
    if not all(part is not None and isinstance(part[0], tuple) for _, part in signature):
        return None
    return names


class RowBuckets:
    """A row-wise form's buckets (the module's words): its feeds' names, dtypes and shapes
    past axis 0, and the bucket sizes from just past ``above`` rows up to the feeds'
    :data:`MAX_BUCKET_BYTES`."""

    def __init__(self, signature: tuple, above: int):
        self.names = tuple(name for name, _ in signature)
        self.rest = {name: part[0][1:] for name, part in signature}
        self.dtypes = {name: np.dtype(part[1]) for name, part in signature}
        row_bytes = sum(math.prod(self.rest[name]) * self.dtypes[name].itemsize
                        for name in self.names)
        self.sizes = bucket_sizes(above, MAX_BUCKET_BYTES // max(1, row_bytes))
        self.above = above
        self._local = threading.local()

    def bucket(self, rows: int) -> int | None:
        """The smallest bucket of at least ``rows`` rows; None past the last."""
        at = bisect.bisect_left(self.sizes, rows)
        return self.sizes[at] if at < len(self.sizes) else None

    def run(self, feeds: dict, run) -> list | None:
        """``run(padded)``'s outputs cut to the request's rows, where ``feeds`` are this
        form's (the same names, dtypes and shapes past axis 0, one number of rows past
        ``above`` within the buckets); None otherwise, nothing run."""
        rows = self._rows(feeds)
        if rows is None:
            return None
        size = self.bucket(rows)
        if size is None or made_up_feeds.in_progress():
            return None
        if size == rows:
            return run(feeds)
        padded = {name: self._padded(name, feeds[name], size) for name in self.names}
        outputs = run(padded)
        return [_first_rows(out, rows, padded) for out in outputs]

    def _rows(self, feeds: dict) -> int | None:
        if feeds.__class__ is not dict or len(feeds) != len(self.names):
            return None
        rows = None
        for name in self.names:
            value = feeds.get(name)
            if value.__class__ is not np.ndarray or value.dtype != self.dtypes[name] \
                    or value.shape[1:] != self.rest[name] or not value.shape:
                return None
            if rows is None:
                rows = value.shape[0]
            elif value.shape[0] != rows:
                return None
        return rows if rows is not None and rows > self.above else None

    def _padded(self, name: str, value: np.ndarray, size: int) -> np.ndarray:
        """``value`` in this thread's buffer for ``name`` as ``size`` rows, the last real
        row repeated into the rest (real values: no NaN or overflow a zero row might make
        where the model divides or takes logs)."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        buffer = buffers.get(name)
        if buffer is None or buffer.shape[0] < size:  # doubling: few growths, little spare
            grown = size if buffer is None else min(self.sizes[-1], max(size, 2 * len(buffer)))
            buffer = buffers[name] = np.empty((grown,) + self.rest[name], self.dtypes[name])
        target = buffer[:size]
        rows = value.shape[0]
        target[:rows] = value
        target[rows:] = value[rows - 1]
        return target


def bucket_sizes(above: int, most: int) -> list[int]:
    """The grid past ``above`` rows: ``above`` times 2^(k / STEPS_PER_DOUBLING), each
    rounded up to a multiple of eight (the panels' rows come in strips), up to ``most``;
    a doubling's last bucket one row short of it. A forest keeps its walk per class of
    batch sizes a power of two apart (``ops/ml/walk_choice.py``): a bucket of 4,096 rows
    put requests of 3,761-4,096 rows in the class above theirs, which only that bucket
    taught (LightGBM's 101 trees: 3.6 ms there against 2.6 at their own sizes)."""
    sizes, step = [], 1
    while True:
        exact = above * 2 ** (step / STEPS_PER_DOUBLING)
        size = -(-math.ceil(exact) // 8) * 8
        if step % STEPS_PER_DOUBLING == 0:
            size = round(exact) - 1
        if size > most:
            return sizes
        if not sizes or size > sizes[-1]:
            sizes.append(size)
        step += 1


def _first_rows(out, rows: int, padded: dict):
    """An output's first ``rows`` rows; a copy where it is a feed's buffer (a graph output
    that is a feed as it was given), which the next request overwrites."""
    if out.__class__ is not np.ndarray:
        return out
    cut = out[:rows]
    if any(np.may_share_memory(cut, buffer) for buffer in padded.values()):
        return cut.copy()
    return cut


def verified(buckets: RowBuckets, run, run_let_go, seed: int = 0) -> bool:
    """Whether a batch of random rows (standard normal floats; integers 0 and 1; booleans)
    gives the same rows in every output at its own size (a size no bucket has: planned and
    let go) as inside its bucket, whose other rows are random too (:func:`_same_rows`); and
    every output is a tensor with the rows on its axis 0. A model that refuses such rows is
    not bucketed."""
    if not buckets.sizes:
        return False
    rng = np.random.default_rng(seed)
    size = buckets.sizes[0]
    rows = size - 3
    with made_up_feeds.made_up():
        try:
            inside = {name: random_array(rng, buckets.dtypes[name],
                                         (size,) + buckets.rest[name], 2)
                      for name in buckets.names}
            alone = {name: np.ascontiguousarray(value[:rows]) for name, value in inside.items()}
            direct = run_let_go(feed_signature(alone), alone)[1]
            bucketed = run(inside)
        except Exception:  # noqa: BLE001  (rows this model refuses: not bucketed)
            return False
    return len(direct) == len(bucketed) and all(
        _same_rows(one, many, rows, size) for one, many in zip(direct, bucketed))


def _same_rows(one, many, rows: int, size: int) -> bool:
    """The rows agree: the same bits, or floats within a few units in their last place (a
    product's last strip of rows or a softmax's last block takes another order of sums
    at another number of rows, as between any two batch sizes; rows read across differ
    by far more where the other rows are random)."""
    if one.__class__ is not np.ndarray or many.__class__ is not np.ndarray \
            or one.shape[:1] != (rows,) or many.shape[:1] != (size,) or one.dtype != many.dtype:
        return False
    if one.tobytes() == many[:rows].tobytes():
        return True
    return one.dtype.kind == "f" and np.allclose(one, many[:rows], rtol=ROWS_RTOL, atol=0,
                                                 equal_nan=True)


ROWS_RTOL = 1e-4  # how far the check lets a float row be (a last bit, raised through exp)
