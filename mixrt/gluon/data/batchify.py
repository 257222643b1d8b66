"""Batchify functions turn the list of samples of one batch into batch arrays.

``default_batchify_fn`` stacks samples of equal shape; for a tuple sample, ``(data, label)``,
it stacks each field separately and returns a tuple of batches. Samples of different
lengths (sentences, say) need :class:`Pad`, and samples whose fields need different
treatment need :class:`Tuple`::

    DataLoader(dataset, batch_size=32, batchify_fn=Tuple(Pad(val=0), Stack()))

Stacking happens on the host in NumPy; each finished batch becomes a ``mixrt.nd.NDArray``
in :func:`to_ndarray`, the one place that touches ``mixrt.nd``.
"""

from __future__ import annotations

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError


def to_ndarray(batch: np.ndarray):
    """A host batch as a ``mixrt.nd.NDArray``, keeping its dtype (integer labels stay
    integer). ``mixrt.nd`` is imported here, on first use, so that datasets and samplers load
    without the imperative frontend."""
    return nd.array(batch, dtype=batch.dtype)


def stack(samples) -> np.ndarray:
    """Samples of one shape (arrays, numbers, NDArrays) stacked along a new first axis."""
    arrays = _host_arrays(samples)
    shapes = sorted({array.shape for array in arrays})
    if len(shapes) > 1:
        raise InputError(f"cannot stack samples of different shapes {shapes}; use "
                         f"mixrt.gluon.data.batchify.Pad for variable-length samples")
    return np.stack(arrays)


def default_batchify_fn(samples):
    """Stack ``samples`` into one NDArray, or, for tuple samples, into a tuple of NDArrays
    with one per field (recursively, so nested tuples give nested tuples)."""
    if samples and isinstance(samples[0], tuple):
        return tuple(default_batchify_fn(list(field)) for field in _fields(samples))
    return to_ndarray(stack(samples))


class Stack:
    """Batchify by stacking samples of equal shape (``default_batchify_fn`` for one field)."""

    def __call__(self, samples):
        return to_ndarray(stack(samples))

    def __repr__(self) -> str:
        return "Stack()"


class Pad:
    """Batchify samples whose first axis differs in length: each is padded at its end with
    ``val`` to the longest one's length. The other axes must agree. The batch has the
    samples' common dtype unless ``dtype`` is given."""

    def __init__(self, val=0, dtype=None):
        self.val, self.dtype = val, dtype

    def __call__(self, samples):
        arrays = _host_arrays(samples)
        if any(array.ndim == 0 for array in arrays):
            raise InputError("Pad needs samples with at least one axis; got a scalar")
        trailing = sorted({array.shape[1:] for array in arrays})
        if len(trailing) > 1:
            raise InputError(f"Pad pads the first axis only; the other axes differ: "
                             f"{sorted({array.shape for array in arrays})}")
        longest = max(len(array) for array in arrays)
        dtype = np.result_type(*arrays) if self.dtype is None else self.dtype
        batch = np.full((len(arrays), longest, *trailing[0]), self.val, dtype=dtype)
        for row, array in zip(batch, arrays):
            row[:len(array)] = array
        return to_ndarray(batch)

    def __repr__(self) -> str:
        return f"Pad(val={self.val!r})"


class Tuple:
    """Batchify field ``i`` of every sample with ``fns[i]``; returns a tuple of batches.
    Takes the functions as arguments, ``Tuple(Pad(), Stack())``, or as one list."""

    def __init__(self, fn, *more):
        single_list = isinstance(fn, (list, tuple)) and not more
        self.fns = tuple(fn) if single_list else (fn, *more)

    def __call__(self, samples):
        return tuple(fn(list(field))
                     for fn, field in zip(self.fns, _fields(samples, len(self.fns))))

    def __repr__(self) -> str:
        return f"Tuple({', '.join(map(repr, self.fns))})"


def _fields(samples, expected: int | None = None) -> list[tuple]:
    """The samples' fields side by side; every sample must have the same number of them."""
    if not samples:
        raise InputError("cannot batchify an empty list of samples")
    counts = sorted({len(sample) for sample in samples})
    if len(counts) > 1 or (expected is not None and counts != [expected]):
        wanted = f"{expected}" if expected is not None else "the same number of"
        raise InputError(f"samples must have {wanted} fields; got samples with {counts}")
    return list(zip(*samples))


def _host_arrays(samples) -> list[np.ndarray]:
    if not samples:
        raise InputError("cannot batchify an empty list of samples")
    return [np.asarray(s.asnumpy() if hasattr(s, "asnumpy") else s) for s in samples]


__all__ = ["default_batchify_fn", "to_ndarray", "stack", "Stack", "Pad", "Tuple"]
