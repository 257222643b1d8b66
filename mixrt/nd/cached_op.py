"""MXNet's ``mx.nd.CachedOp``: a Symbol called as one imperative operator.

    op = nd.CachedOp(sym.Convolution(kernel=(3, 3), num_filter=10) + 2)
    y = op(data, weight, bias)             # inputs in ``sym.list_inputs()`` order
    op(data, weight, bias, out=y)          # or into given arrays

The Symbol becomes a graph once per input signature (shapes, dtypes, device) and runs as
one planned Session. Under ``autograd.record()`` with an input that wants a gradient the
same graph runs op by op through the imperative dispatcher instead (``autograd.replay``),
so every op lands on the tape and ``backward`` reaches the inputs.

The Symbol is only asked for ``list_inputs``, ``list_outputs`` and ``to_graph``: this module
imports nothing from ``mixrt.sym``, which itself builds on ``mixrt.nd``.
"""

from __future__ import annotations

from mixrt import tape
from mixrt.tape.replay import replay
from mixrt.base.errors import DeviceMismatchError, InputError, ShapeError
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.lru import LruCache
from mixrt.runtime.session import Session

# input signatures a CachedOp keeps compiled (as a hybridized block keeps its traces)
MAX_SIGNATURES = 32


class CachedOp:
    """``sym`` as a callable on NDArrays. ``flags`` are MXNet's CachedOp options
    (``static_alloc``, ``static_shape``, ...), kept for ``flags``: mixrt plans every
    signature's memory statically anyway."""

    def __init__(self, sym, flags=()):
        self.symbol = sym
        self.flags = dict(flags)
        self.input_names = list(sym.list_inputs())
        self._compiled = LruCache(MAX_SIGNATURES)

    def __call__(self, *args, out=None, default_ctx=None):
        inputs = self._checked(args)
        ctx = inputs[0].ctx if inputs else default_ctx
        if ctx is None:
            raise InputError("CachedOp: a symbol without inputs needs default_ctx=")
        with ctx.device.active():
            outputs = self._run(inputs, ctx)
        if out is not None:
            return write_into(out, outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _run(self, inputs: list, ctx) -> list:
        compiled = self._compiled_for(inputs, ctx)
        if tape.needs_tape(inputs):  # op by op, so the tape sees each one
            return replay(compiled.graph, dict(zip(self.input_names, inputs)), ctx)
        feeds = {name: array._read() for name, array in zip(self.input_names, inputs)}
        return [NDArray(value, ctx) for value in compiled.session().run_on_device(None, feeds)]

    def _compiled_for(self, inputs: list, ctx) -> "_Signature":
        key = (tuple((a.shape, a.dtype.str) for a in inputs), str(ctx))
        compiled = self._compiled.get(key)
        if compiled is None:
            shapes = {n: a.shape for n, a in zip(self.input_names, inputs)}
            dtypes = {n: a.dtype for n, a in zip(self.input_names, inputs)}
            graph = self.symbol.to_graph(shapes=shapes, dtypes=dtypes)
            compiled = self._compiled.put(key, _Signature(graph, ctx))
        return compiled

    def _checked(self, args) -> list:
        if len(args) != len(self.input_names):
            raise InputError(f"CachedOp: the symbol reads {len(self.input_names)} input(s) "
                             f"{self.input_names}, called with {len(args)}")
        for name, value in zip(self.input_names, args):
            if not isinstance(value, NDArray):
                raise InputError(f"CachedOp: input {name!r} is a {type(value).__name__}; "
                                 f"a CachedOp takes NDArrays")
        for name, value in zip(self.input_names[1:], args[1:]):
            if value.ctx != args[0].ctx:
                raise DeviceMismatchError(f"CachedOp: input {name!r} is on {value.ctx}, "
                                          f"{self.input_names[0]!r} on {args[0].ctx}")
        return list(args)


class _Signature:
    """One input signature's graph, and its Session once a call runs without the tape."""

    def __init__(self, graph, ctx):
        self.graph, self.ctx = graph, ctx
        self._session = None

    def session(self) -> Session:
        if self._session is None:
            self._session = Session(self.graph, device=str(self.ctx.device))
        return self._session


def write_into(out, outputs: list, owner: str = "CachedOp"):
    """Copy the outputs into ``out`` (an NDArray, or a list of as many as there are
    outputs) and give ``out`` back, as MXNet does; errors name ``owner``."""
    targets = [out] if isinstance(out, NDArray) else list(out)
    if len(targets) != len(outputs):
        raise InputError(f"{owner}: out= has {len(targets)} array(s), the {owner} has "
                         f"{len(outputs)} output(s)")
    for index, (target, value) in enumerate(zip(targets, outputs)):
        if tuple(target.shape) != tuple(value.shape):
            raise ShapeError(f"{owner}: out[{index}] has shape {tuple(target.shape)}, "
                             f"output {index} has {tuple(value.shape)}")
        target[:] = value
    return out
