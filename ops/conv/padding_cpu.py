"""The zero-padded images the CPU convolutions read (im2col's windows, kernel rows,
shift-and-add): one zeroed buffer per thread, input shape and padding, kept between calls,
of which only the interior is ever written, so its border is zeroed once.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.workspace import workspace_state

# bytes of zero-bordered padding buffers kept per thread, one per input shape and padding
# (_padding); the most recently used one is kept whatever its size
PADDING_BYTES_KEPT = 1 << 24


def _padded(x, begin, end):
    """``x`` zero-padded on its spatial axes, in a per-thread buffer (:func:`_padding`)."""
    if not any(begin) and not any(end):
        return x
    padding = _padding(x.shape, x.dtype, tuple(begin), tuple(end))
    padding.array[padding.interior] = x
    return padding.array


class _Padding:
    """A zeroed buffer for one input shape and padding, and the views made of it. Only its
    interior is ever written (the same cells every time), so its border stays zero and is
    never written again; windows over it are made once. ``flat`` is the buffer as (C, plane
    + spill): each channel's padded plane followed by ``spill`` zeros."""

    def __init__(self, shape, dtype, begin, end, spill=0):
        dims = tuple(d + b + e for d, b, e in zip(shape[1:], begin, end))
        plane = math.prod(dims)
        self.flat = np.zeros((shape[0], plane + spill), dtype)
        self.array = self.flat[:, :plane].reshape((shape[0],) + dims)
        self.interior = (slice(None),) + tuple(slice(b, b + d)
                                               for b, d in zip(begin, shape[1:]))
        self.views: dict = {}


def _padding(shape, dtype, begin, end, spill=0) -> _Padding:
    """This thread's :class:`_Padding` for the input ``shape``/``dtype`` and ``begin``/``end``
    pads (plus ``spill`` zeros per channel after the padded planes, for shift-and-add). A
    zeroed padding per call cost 5-8 us on 7x7 and 8x8 planes (four border writes) and
    DenseNet's shift-and-add zeroed its whole buffer. A model has a handful of paddings;
    the most recently used ones are kept, up to :data:`PADDING_BYTES_KEPT` per thread."""
    key = (tuple(shape), np.dtype(dtype).str, begin, end, spill)
    kept = workspace_state().setdefault("paddings", {})
    padding = kept.pop(key, None)
    if padding is None:
        padding = _Padding(shape, dtype, begin, end, spill)
        total = padding.flat.nbytes + sum(p.flat.nbytes for p in kept.values())
        while kept and total > PADDING_BYTES_KEPT:
            total -= kept.pop(next(iter(kept))).flat.nbytes
    kept[key] = padding  # most recently used last
    return padding
