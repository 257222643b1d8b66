"""MXNet's function names on Symbols (``F.broadcast_add``, ``F.slice_axis``, ``F.topk``,
``F.one_hot``, ``F.BlockGrad``, ...), so a ``hybrid_forward`` that uses them hybridizes.

There is one implementation of each, the imperative one (``mixrt/nd/mxnet_ops.py``), with
MXNet's argument checks and semantics. Here it runs on :class:`Traced`, a stand-in for the
Symbol: it has the static shape and dtype the trace knows (``sym.tracing.static_shape``;
outside a trace, what the Symbol's declared variables give), and each op or constant the
imperative code makes is added to the Symbol's graph instead of being run. A function that
needs a tensor's value (``take(..., mode='raise')`` reads the indices) raises the
HybridizeError that names the block and the line.

The names that are NDArray methods in MXNet are Symbol methods too (``x.topk(k=2)``).
"""

from __future__ import annotations

import inspect

import numpy as np

from mixrt.array_methods import ArrayMethods
from mixrt.base.errors import HybridizeError
from mixrt.nd import mxnet_ops as imperative
from mixrt.sym.symbol import (call_op, constant, LAYER, layer_name, MXNET_OP, MXNET_PARAMS,
                               prefixed, Symbol)
from mixrt.sym.tracing import static_shape


class _TraceContext:
    """The ``ctx`` of a Traced: constants made "on" it are NumPy arrays in the graph."""

    traced = True

    def __repr__(self) -> str:
        return "traced"


TRACE = _TraceContext()


class Traced(ArrayMethods):
    """A single-output Symbol seen as the NDArray ``mixrt.nd.mxnet_ops`` expects."""

    __slots__ = ("symbol", "_type")
    ctx = TRACE
    # NumPy constants meet a Traced in the imperative code (``steps < lengths``): NumPy must
    # hand the operator to the Traced (its reflected method) instead of looping over it
    __array_ufunc__ = None

    def __init__(self, symbol: Symbol):
        self.symbol = symbol
        self._type = None

    # -- what the imperative code reads -------------------------------------------------

    @property
    def shape(self) -> tuple:
        return static_shape(self.symbol)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self) -> np.dtype:
        if self._type is None:
            dtype = self.symbol.infer_type()[1][0]
            if dtype is None:
                raise HybridizeError(f"the dtype of {self.symbol.list_outputs()[0]} is not "
                                     f"known while tracing; declare its variables' dtypes")
            self._type = np.dtype(dtype)
        return self._type

    def asnumpy(self):
        return self.symbol.asnumpy()  # the HybridizeError naming the block and the line

    def zeros_like(self) -> np.ndarray:
        return np.zeros(self.shape, dtype=self.dtype)

    def argmax(self, axis=None, keepdims: bool = False):
        return self._arg("ArgMax", axis, keepdims)

    def argmin(self, axis=None, keepdims: bool = False):
        return self._arg("ArgMin", axis, keepdims)

    def _arg(self, op_type: str, axis, keepdims: bool):
        """NDArray's rule: ``axis=None`` is over the flattened array."""
        if axis is not None:
            return self._op(op_type, [self], {"axis": axis, "keepdims": int(keepdims)})
        flat = self.reshape(-1)
        index = flat._op(op_type, [flat], {"axis": 0, "keepdims": 0})
        return index.reshape((1,) * self.ndim) if keepdims else index

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise HybridizeError(f"indexing a traced Symbol with {key!r}: only a slice of "
                                 f"the first axis is supported here")
        start, stop, step = key.indices(self.shape[0])
        return self._op("Slice", [self, *(np.array([v], np.int64)
                                          for v in (start, stop, 0, step))], {})

    # -- how ops and constants reach the graph ------------------------------------------

    def traced_op(self, op_type: str, inputs: list, attributes: dict, num_outputs=None,
                  domain: str = ""):
        symbols = [_symbol_of(value) for value in inputs]
        scope = _calls[-1] if _calls else None
        out = call_op(domain, op_type, symbols, dict(attributes),
                      name=None if scope is None else scope.inner_name(op_type),
                      num_outputs=num_outputs, exact_name=scope is not None)
        if scope is not None:
            out._outputs[0][0].info[LAYER] = scope.head
            out._outputs[0][0].info[MXNET_OP] = scope.function
        if num_outputs is not None and num_outputs > 1 or len(out) > 1:
            return [Traced(out[i]) for i in range(len(out))]
        return Traced(out)

    def _op(self, op_type: str, inputs: list, attributes: dict):
        return self.traced_op(op_type, inputs, attributes)

    def _int_tensor(self, values):
        return np.asarray([int(v) for v in values], dtype=np.int64)

    def _binary(self, op_type: str, other, reverse: bool = False):
        if not isinstance(other, (Traced, Symbol, np.ndarray)):
            other = np.asarray(other, dtype=self.dtype)  # a number takes the array's type
        pair = [other, self] if reverse else [self, other]
        return self._op(op_type, pair, {})

    def __mod__(self, other):
        return self._op("Mod", [self, other], {"fmod": int(self.dtype.kind == "f")})

    def __neg__(self):
        return self._op("Neg", [self], {})


def _symbol_of(value):
    if isinstance(value, Traced):
        return value.symbol
    return value


def _traced(value):
    """Symbols (also inside lists and tuples) as Traced; anything else as it is."""
    if isinstance(value, Symbol):
        if len(value) != 1:
            return [Traced(value[i]) for i in range(len(value))]
        return Traced(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, Symbol) for v in value):
        return type(value)(_traced(v) for v in value)
    return value


def _symbols(value):
    if isinstance(value, Traced):
        return value.symbol
    if isinstance(value, (list, tuple)):
        return type(value)(_symbols(v) for v in value)
    if isinstance(value, np.ndarray):  # a constant result (zeros_like): into the graph
        return constant(value)
    return value


class _Call:
    """One MXNet function called on Symbols: MXNet makes it one node, ``name`` or the
    function's automatic name (``arctan0``). The nodes its imperative body adds are named
    ``<name>_<op><k>`` as one layer's, and its single output node is renamed ``<name>``,
    so names and counters are MXNet's whatever the body builds it from."""

    def __init__(self, function: str, name: str | None):
        self.function = function
        self.name = layer_name(function, name)
        self.head = prefixed(self.name)
        self._counts: dict[str, int] = {}

    def inner_name(self, op_type: str) -> str:
        kind = op_type.lower()
        count = self._counts.get(kind, 0)
        self._counts[kind] = count + 1
        return f"{self.name}_{kind}{count}"

    def named(self, result):
        """The result with its output node named the call's, when the body made it and
        every output is that node's (``split``'s several too)."""
        if isinstance(result, Symbol):
            nodes = {id(node): node for node, _ in result._outputs}
            node = next(iter(nodes.values()))
            if len(nodes) == 1 and node.info.get(LAYER) == self.head \
                    and len(result) == node.num_outputs:
                node.name = self.head
        return result


_calls: list[_Call] = []  # the MXNet functions being traced, innermost last


def _on_symbols(name: str):
    function = getattr(imperative, name)
    signature = inspect.signature(function)

    def on_symbols(*args, name=None, **kwargs):
        _calls.append(_Call(on_symbols.__name__, name))
        try:
            result = function(*[_traced(a) for a in args],
                              **{k: _traced(v) for k, v in kwargs.items()})
            result = _calls[-1].named(_symbols(result))
            _record_parameters(result, _calls[-1].head, signature, args, kwargs)
            return result
        finally:
            _calls.pop()

    on_symbols.__name__ = on_symbols.__qualname__ = name
    on_symbols.__doc__ = function.__doc__
    return on_symbols


def _record_parameters(result, head: str, signature, args: tuple, kwargs: dict) -> None:
    """The parameters the call was given, as MXNet keeps them (strings; ``{"axis": "1"}``),
    on its output node, which list_attr shows (the Symbols given are inputs, not
    parameters)."""
    if not isinstance(result, Symbol):
        return
    try:
        given = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return  # the function has refused the call already, or takes it another way
    parameters = {key: str(value) for key, value in given.items()
                  if value is not None and not _holds_symbol(value)
                  and signature.parameters[key].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                             inspect.Parameter.VAR_KEYWORD)
                  and key != "out"}
    nodes = {id(node): node for node, _ in result._outputs}
    if parameters and len(nodes) == 1:
        node = next(iter(nodes.values()))
        if node.name == head:
            node.info[MXNET_PARAMS] = parameters


def _holds_symbol(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_symbol(v) for v in value)
    return isinstance(value, Symbol)


# (MXNet's layers are mixrt.layers', bound for symbols in mixrt.sym.symbol_layers: they make
# their weights as variables); softmax, log_softmax and dot replace the array_methods ones,
# so that they take MXNet's arguments (temperature, length, transpose_a, ...) as mixrt.nd's do
FUNCTIONS = {name: _on_symbols(name) for name in imperative.FUNCTIONS}


def attach_methods() -> None:
    """MXNet's NDArray methods (``x.topk``, ``x.slice_axis``, ...) on Symbol, where Symbol
    has no method of that name already."""
    for name in imperative.METHODS:
        if name in FUNCTIONS and not hasattr(Symbol, name):
            setattr(Symbol, name, FUNCTIONS[name])
