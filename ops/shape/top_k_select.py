"""TopK's k entries of each row by selection, not by sorting the whole axis.

``index._top_k`` stable-sorts the axis and keeps its first k: O(n log n) a row for k of n.
A nearest-neighbours model asks the 5 nearest of 1,797 distances for each of its rows
(skl2onnx's k-NN): at 6,628 rows the sort took 816 ms of a 1.5 s run, against
onnxruntime's whole run of 0.45 s (2026-11-27). Here each row's k-th entry is found by
partition (O(n)), the entries before it are taken, with those equal to it by index, and
only those k are sorted: the same indices in the same order as the sort (-0.0 equal to
0.0, ties to the smaller index). A row that holds a NaN, whose place the comparisons
cannot say, takes the sort.
"""

from __future__ import annotations

import numpy as np

# the shortest axis, and the largest share of it that k may be, for which selecting pays
SELECT_FROM_LENGTH = 64
SELECT_MOST_SHARE = 4  # k up to a quarter of the axis


def suits(X, k: int) -> bool:
    """Whether :func:`top_k_indices` takes TopK over the last axis of host array X."""
    n = X.shape[-1] if X.ndim else 0
    return (isinstance(X, np.ndarray) and n >= SELECT_FROM_LENGTH
            and 0 < k * SELECT_MOST_SHARE <= n and X.size > 0
            and (X.dtype.kind in "iub" or X.dtype in _FLOATS))


# NumPy's own floats; ml_dtypes' (bfloat16, ...) sort by their own comparisons, which this
# does not follow for NaN
_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def top_k_indices(X: np.ndarray, k: int, largest: bool, sort_rows) -> np.ndarray:
    """int64 indices [..., k] of the k largest (or smallest) entries of each row of X's last
    axis, in TopK's order. ``sort_rows(rows)``: the sorting path's indices for rows [R, n]
    (the rows holding NaN take it)."""
    rows = X.reshape(-1, X.shape[-1])
    if rows.dtype.kind == "b":
        rows = rows.view(np.uint8)
    with_nan = np.flatnonzero(np.isnan(rows).any(axis=1)) if rows.dtype.kind == "f" \
        else np.empty(0, np.intp)
    if with_nan.size:
        indices = np.empty((rows.shape[0], k), np.int64)
        indices[with_nan] = sort_rows(rows[with_nan])
        plain = np.ones(rows.shape[0], bool)
        plain[with_nan] = False
        chosen = np.flatnonzero(plain)
        indices[chosen] = _selected(rows[chosen], k, largest)
    else:
        indices = _selected(rows, k, largest)
    return indices.reshape(X.shape[:-1] + (k,))


def _selected(rows: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """:func:`top_k_indices` for rows without NaN: the k-th value by partition, the entries
    before it and, by index, those equal to it, then those k in TopK's order."""
    if not rows.shape[0]:
        return np.empty((0, k), np.int64)
    n = rows.shape[1]
    at_k = k - 1 if not largest else n - k
    threshold = np.partition(rows, at_k, axis=1)[:, at_k:at_k + 1]
    before = rows > threshold if largest else rows < threshold
    at = rows == threshold  # -0.0 equals 0.0, as in the sort
    wanted = k - before.sum(axis=1)
    take = before | at
    tied = np.flatnonzero(at.sum(axis=1) > wanted)  # more equal to the k-th than are left
    if tied.size:
        ranks = np.cumsum(at[tied], axis=1)
        take[tied] = before[tied] | (at[tied] & (ranks <= wanted[tied, None]))
    indices = np.nonzero(take)[1].reshape(rows.shape[0], k)  # ascending index in each row
    values = np.take_along_axis(rows, indices, axis=1)
    if largest:  # descending, ties by index: exact for every dtype (no NaN here)
        values = -values if rows.dtype.kind == "f" else ~values
    order = np.argsort(values, axis=1, kind="stable")
    return np.take_along_axis(indices, order, axis=1)
