"""The state of a HybridBlock's trace (``mixrt.gluon.hybrid``) that symbols read while it
runs: the blocks being traced, each parameter's Symbol, and the shapes the inputs are
traced for, from which :func:`static_shape` answers for any Symbol of the trace. It lives
below both ``mixrt.sym`` and ``mixrt.gluon``, so neither imports the other for it.
"""

from __future__ import annotations

import threading

from mixrt.base.errors import HybridizeError
from mixrt.sym.symbol import Symbol


class Tracing(threading.local):
    blocks: list = []
    variables: dict | None = None  # parameter name -> its Symbol, for this trace
    shapes: dict | None = None  # input name -> the shape it is traced for


tracing = Tracing()


def static_shape(x) -> tuple:
    """The shape of ``x``, an NDArray or a Symbol being traced (from the shapes the trace
    was made for): what a block that unrolls over a dimension needs. A block
    using it is traced again for each new input shape."""
    if not isinstance(x, Symbol):
        return tuple(x.shape)
    known = {n: s for n, s in (tracing.shapes or {}).items() if n in x.list_inputs()}
    shape = x._known_shapes((), known)[1][0]
    if shape is None or any(d is None for d in shape):
        raise HybridizeError(f"static_shape: the shape of {x.list_outputs()[0]} is not "
                             f"known while tracing (known input shapes: {known})")
    return tuple(shape)
