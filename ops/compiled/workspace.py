"""Per-thread scratch memory the CPU kernels of every family carve their temporaries from
(one aligned workspace, reused between calls; named buffers for what must outlive a carve),
and the per-node cache of prepacked weights.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from mixrt.ops.device import ALIGNMENT, aligned, aligned_empty

_workspace = threading.local()


def workspace(nbytes: int) -> np.ndarray:
    """A per-thread scratch buffer of at least ``nbytes`` (kept between calls)."""
    buffer = getattr(_workspace, "buffer", None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = aligned_empty(max(nbytes, 1))
        _workspace.buffer = buffer
    return buffer


def scratch_arrays(dtype, *shapes) -> list[np.ndarray]:
    """Arrays of the given shapes carved from this thread's workspace, one after another.
    Conv and the pools use it; they never run inside one another, so they share it."""
    dtype = np.dtype(dtype)
    sizes = [math.prod(s) * dtype.itemsize for s in shapes]
    buffer = workspace(sum(sizes))
    arrays, start = [], 0
    for shape, nbytes in zip(shapes, sizes):
        arrays.append(buffer[start:start + nbytes].view(dtype).reshape(shape))
        start += nbytes
    return arrays


def typed_scratch(*specs) -> list[np.ndarray]:
    """Arrays for ``(dtype, shape)`` pairs carved from this thread's workspace (which starts
    aligned), each starting on a 64-byte boundary; as :func:`scratch_arrays`, valid until the
    next carve."""
    sizes = [-(-math.prod(shape) * np.dtype(dtype).itemsize // ALIGNMENT) * ALIGNMENT
             for dtype, shape in specs]
    buffer = workspace(sum(sizes))
    start = 0
    arrays = []
    for (dtype, shape), nbytes in zip(specs, sizes):
        count = math.prod(shape) * np.dtype(dtype).itemsize
        arrays.append(buffer[start:start + count].view(dtype).reshape(shape))
        start += nbytes
    return arrays


def named_buffer(name: str, nbytes: int) -> np.ndarray:
    """``nbytes`` of a per-thread scratch buffer named ``name`` (kept between calls)."""
    buffer = getattr(_workspace, name, None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = aligned_empty(nbytes)
        setattr(_workspace, name, buffer)
    return buffer[:nbytes]


def packed(prepacked: dict | None, layout, make):
    """The weight in ``layout``, made by ``make()``: once per session node when the weight is
    a constant (``prepacked`` is that node's dict), else on every call. Two threads making it
    at once both compute it and keep the first; either copy is the same. (:func:`geometry`
    keeps the node's window geometry per input shape here too, under a tuple key.)"""
    if prepacked is None:
        return make()
    value = prepacked.get(layout)
    if value is None:
        value = prepacked.setdefault(layout, aligned(make()))
    return value


def workspace_state() -> dict:
    """This thread's workspace attributes, for a kernel that keeps its own buffers there
    (the convolutions' zero-bordered paddings)."""
    return _workspace.__dict__


# What a node works out for one input shape (its window geometry, its direct convolution's
# layout, its pooled bands) is kept in its dict too, but a service sending a new image size
# per request added one of each per size, for as long as it ran: a SqueezeNet's 1x1
# convolutions held 160-170 entries each after 100 sizes, all of them objects every full
# collection walks (2026-11-27). So they are kept apart, the last MAX_SHAPES_KEPT shapes'.
MAX_SHAPES_KEPT = 32
SHAPES_KEY = ("kept per input shape",)


def per_shape(prepacked: dict | None, key, make):
    """``make()`` for ``key`` (which names the input shape), kept in the node's dict among
    the last MAX_SHAPES_KEPT keys made (the oldest made goes first); made on every call
    without a dict."""
    if prepacked is None:
        return make()
    kept = prepacked.get(SHAPES_KEY)
    if kept is None:
        kept = prepacked.setdefault(SHAPES_KEY, {})
    value = kept.get(key)
    if value is None:
        if len(kept) >= MAX_SHAPES_KEPT:
            try:
                del kept[next(iter(kept))]
            except (KeyError, RuntimeError, StopIteration):
                pass  # another thread let one go at once
        value = kept.setdefault(key, make())
    return value
