"""Symbol: a graph described by composing functions (the MXNet paper's deep embedding, §2.1).

    data = sym.Variable("data", shape=(None, 784))
    fc1 = sym.Gemm(data, sym.Variable("fc1_weight", shape=(128, 784)), transB=1, name="fc1")
    net = sym.Relu(fc1, name="relu1")
    net.infer_shape(data=(32, 784))         # ([arg shapes], [output shapes], [aux shapes])
    executor = net.simple_bind(data=(32, 784))

A Symbol is an immutable handle on one or more outputs of a DAG of nodes. Nodes are ONNX
operators (one generated function per registered op, see ``mixrt.sym``), variables (the
graph's inputs: data and parameters) and constants. ``to_graph()`` lowers it to mixrt's Graph
IR, which every other part of mixrt consumes; ``tojson()`` saves it without pickle.

This module holds the handle itself (its outputs, composition, arithmetic, its refusal to
be a value, saving and running) and the ways to make one (``Variable``, ``constant``,
``Group``, ``prefix``). The class is composed of parts that live beside it, each one
concern: the nodes and their records (``symbol_nodes.py``), the structural queries
(``symbol_structure.py``), lowering to a Graph (``symbol_lowering.py``) and shape and dtype
inference (``symbol_inference.py``), its JSON (``symbol_json.py``). Two things it calls
stand above it, as they are built from Symbols: the op calls of its arithmetic and layers
(``ops.py``) and the Executor that binds it (``executor.py``); those modules hand them in as
they load (``handed_in.py``).
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np

from mixrt import attribute
from mixrt.array_methods import ArrayMethods, beyond_onnx_reshape
from mixrt.base import MXNET_DTYPE_CODES, STORAGE_TYPE_IDS, NotImplementedForSymbol
from mixrt.base.errors import GraphError
from mixrt.initializer import create
# symbol_module.hand_in, as the modules that hand things in call it
from mixrt.sym.handed_in import _HANDED_IN, _handed_in, hand_in  # noqa: F401
from mixrt.sym import symbol_json
from mixrt.sym.partial_shapes import SAME_SHAPE
from mixrt.sym.symbol_inference import _unknown_as_none, SymbolInference
from mixrt.sym.symbol_lowering import SymbolLowering
from mixrt.sym.symbol_nodes import (  # noqa: F401  (the names mixrt.sym's modules import from here)
    _INFO_KEYS, _layer_inputs, ATTRIBUTES, DEFAULT_DTYPE, INPUT_ORDER, LAYER, LOSS_HEAD,
    MXNET_OP, MXNET_PARAMS, OUTPUT_SUFFIX, SymNode)
from mixrt.sym.symbol_structure import SymbolStructure


def _call_op(domain: str, op_type: str, inputs: list, attributes: dict) -> "Symbol":
    return _HANDED_IN["call_op"](domain, op_type, inputs, attributes)


class ValueNeeded(GraphError, NotImplementedForSymbol):
    """A Symbol used where Python needs a value: a GraphError, and MXNet's
    NotImplementedForSymbol, which MXNet code catches."""

    def __init__(self, message: str):
        Exception.__init__(self, message)
        self.function, self.alias = None, None


_NOT_IMPLEMENTED_KINDS: dict[type, type] = {}


def _not_implemented_for_symbol(error: Exception) -> Exception:
    """``error`` (the traced block's refusal) as one that is also MXNet's
    NotImplementedForSymbol, which MXNet code catches around ``bool(symbol)``."""
    kind = type(error)
    if kind not in _NOT_IMPLEMENTED_KINDS:
        _NOT_IMPLEMENTED_KINDS[kind] = type(kind.__name__, (kind, NotImplementedForSymbol), {
            "__init__": ValueNeeded.__init__, "__module__": kind.__module__})
    return _NOT_IMPLEMENTED_KINDS[kind](str(error))


def value_error(what: str) -> GraphError:
    """The error for a Symbol used where Python needs a value (``mixrt.gluon`` replaces it
    with one that names the HybridBlock being traced and the line)."""
    return ValueNeeded(f"a Symbol has no value until its graph runs; it cannot be {what}")


_constant_ids = itertools.count()


class Symbol(SymbolStructure, SymbolLowering, SymbolInference, ArrayMethods):
    """Outputs of a DAG of SymNodes (one for most ops, several for a Group or a multi-output
    op). Immutable: composition and indexing make new Symbols that share nodes."""

    def __init__(self, outputs: list[tuple[SymNode, int]]):
        self._outputs = list(outputs)

    # -- its outputs, as a sequence ------------------------------------------------------

    def __len__(self) -> int:
        return len(self._outputs)

    def __iter__(self):
        return (Symbol([out]) for out in self._outputs)

    def __getitem__(self, key) -> "Symbol":
        if isinstance(key, str):
            names = self.list_outputs()
            if key not in names:
                raise GraphError(f"symbol has no output {key!r}; its outputs are "
                                 f"{_listing(names)}")
            return Symbol([self._outputs[names.index(key)]])
        if isinstance(key, slice):
            return Symbol(self._outputs[key])
        if not -len(self._outputs) <= key < len(self._outputs):
            raise GraphError(f"output index {key} out of range: the symbol has "
                             f"{len(self._outputs)} outputs")
        return Symbol([self._outputs[key]])

    def __repr__(self) -> str:
        if len(self._outputs) == 1:
            return f"<Symbol {self.name}>"
        return f"<Symbol group [{', '.join(self.list_outputs())}]>"

    # -- composition ---------------------------------------------------------------------

    def __call__(self, *args, name: str | None = None, **kwargs) -> "Symbol":
        """Composition: a copy of this symbol with variables replaced by symbols, by name
        (``net(data=other)``) or positionally in ``list_arguments()`` order. ``name``
        renames the single output node of the copy (MXNet's ``name=``)."""
        composed = self._composed(args, kwargs)
        head = composed._single_node("compose with name=") if name is not None else None
        if head is not None and not head.is_variable:  # a copy: renaming it touches no other
            head.name = name
        return composed

    def _composed(self, args, kwargs) -> "Symbol":
        arguments = self.list_arguments()
        if len(args) > len(arguments):
            raise GraphError(f"symbol takes {len(arguments)} arguments {arguments}; got "
                             f"{len(args)} positional")
        replace = dict(zip(arguments, args))
        for name, value in kwargs.items():
            if name not in self.list_inputs():
                raise GraphError(f"cannot compose: the symbol has no variable {name!r}; "
                                 f"its variables are {self.list_inputs()}")
            if name in replace:
                raise GraphError(f"cannot compose: variable {name!r} given twice")
            replace[name] = value
        for name, value in replace.items():
            if not isinstance(value, Symbol) or len(value) != 1:
                raise GraphError(f"cannot compose: variable {name!r} must be replaced by a "
                                 f"single-output Symbol, got {value!r}")
        return self._replaced({k: v._outputs[0] for k, v in replace.items()})

    def _replaced(self, replace: dict) -> "Symbol":
        copies: dict[int, SymNode] = {}

        def entry(old):
            if old is None:
                return None
            node, index = old
            if node.is_variable and node.name in replace:
                return replace[node.name]
            return copies[id(node)], index

        for node in self._topological():
            if node.is_variable and node.name in replace:
                continue
            copies[id(node)] = SymNode(node.op, node.name, [entry(i) for i in node.inputs],
                                       dict(node.attrs), node.domain, node.opset,
                                       node.num_outputs, dict(node.info))
        return Symbol([entry(out) for out in self._outputs])

    # -- arithmetic: ONNX ops, scalars as constants cast to the other operand's dtype --------

    def _binary(self, op_type: str, other, reverse: bool = False) -> "Symbol":
        both = isinstance(other, Symbol)
        other = other if both else scalar_like(other, self)
        left, right = (other, self) if reverse else (self, other)
        made = _call_op("", op_type, [left, right], {})
        if both:  # MXNet's Symbol arithmetic is elementwise: operands of one shape
            made._outputs[0][0].info[SAME_SHAPE] = "loose"
        return made


    def __neg__(self):
        return _call_op("", "Neg", [self], {})

    def _op(self, op_type: str, inputs: list, attributes: dict) -> "Symbol":
        return _call_op("", op_type, list(inputs), dict(attributes))

    def _named_op(self, kind: str, op_type: str, inputs: list, attributes: dict,
                  name: str | None = None, domain: str = "") -> "Symbol":
        return _HANDED_IN["call_op"](domain, op_type, list(inputs), dict(attributes),
                                     name=_HANDED_IN["layer_name"](kind, name))

    def _named_reshape(self, codes: list[int], reverse: bool, name=None) -> "Symbol":
        if beyond_onnx_reshape(codes, reverse):
            return self._mxnet_reshape(codes, reverse, name)
        return self._named_op("reshape", "Reshape", [self, self._int_tensor(codes)], {},
                              name)

    def _mxnet_reshape(self, codes: list[int], reverse: bool, name=None) -> "Symbol":
        # a symbol's shape is known only when it runs, so the codes travel to the kernel
        # (its node, unnamed, is named for it: mxreshape0, which its errors name)
        return _HANDED_IN["call_op"]("mixrt", "MXReshape", [self],
                                     {"shape": codes, "reverse": int(reverse)}, name=name)

    def _int_tensor(self, values) -> "Symbol":
        return constant(np.asarray([int(v) for v in values], dtype=np.int64))

    __hash__ = object.__hash__  # comparisons build symbols, so identity is the hash

    # -- a Symbol has no value: refuse to become one (instead of being silently truthy) -----

    def __bool__(self):
        error = value_error("used as a Python bool (an if, while, and/or, assert)")
        raise error if isinstance(error, NotImplementedForSymbol) else \
            _not_implemented_for_symbol(error)

    def __float__(self):
        raise value_error("converted with float()")

    def __int__(self):
        raise value_error("converted with int()")

    def __index__(self):
        raise value_error("used as an index or a size")

    def __array__(self, *args, **kwargs):
        raise value_error("converted to a NumPy array")

    def asnumpy(self):
        raise value_error("read with asnumpy()")

    def asscalar(self):
        raise value_error("read with asscalar()")

    # -- saving --------------------------------------------------------------------------

    def tojson(self) -> str:
        return symbol_json.to_json(self)

    def save(self, path) -> None:
        from pathlib import Path  # noqa: PLC0415
        Path(path).write_text(self.tojson(), encoding="utf-8")

    def __getstate__(self) -> dict:
        """Pickled as its JSON (MXNet's way), so a pickle holds no code of ours."""
        return {"json": self.tojson()}

    def __setstate__(self, state: dict) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("json"), str):
            raise GraphError(f"cannot unpickle a Symbol from {type(state).__name__}: "
                             f"expected {{'json': symbol JSON}}")
        self._outputs = symbol_json.outputs_from_text(state["json"], "pickled Symbol")

    # -- running -------------------------------------------------------------------------

    def bind(self, ctx="cpu", args=None, args_grad=None, grad_req="write", aux_states=None,
             **options):
        """An Executor over ``args`` (a dict by name or a list in ``list_arguments()``
        order); gradients go to ``args_grad`` (allocated when None)."""
        return _handed_in("Executor")(self, ctx, args, args_grad, grad_req, aux_states,
                                      **options)

    def simple_bind(self, ctx="cpu", grad_req="write", type_dict=None, **shapes):
        """bind with every array allocated from the inferred shapes (zeros; initialize
        with ``executor.init_params``)."""
        return _handed_in("simple_bind")(self, ctx, grad_req, type_dict or {}, shapes)

    def eval(self, ctx="cpu", **kwargs) -> list:
        """Run once on the given arrays (every variable by name); the outputs."""
        executor = self.bind(ctx, args={k: v for k, v in kwargs.items()
                                        if k in self.list_arguments()},
                             aux_states={k: v for k, v in kwargs.items()
                                         if k in self.list_auxiliary_states()},
                             grad_req="null")
        return executor.forward()


# -- building blocks -------------------------------------------------------------------------

def Variable(name: str, shape=None, dtype=None, init=None, *, aux: bool = False,
             lr_mult: float | None = None, wd_mult: float | None = None,
             attr: dict | None = None, stype: str | None = None, **attributes) -> Symbol:
    """A graph input (data, a label or a parameter). ``shape`` may hold None for a dimension
    known only when bound; ``init`` (an initializer, its name or spec) is what
    ``Executor.init_params`` uses for it. Inside ``sym.prefix(p)`` the name gets ``p``.
    ``stype`` (MXNet's storage type) is kept as the ``__storage_type__`` attribute; other
    keywords are MXNet's extra attributes, ``__<key>__`` (``__layout__="NCHW"``), kept as
    they are."""
    if not isinstance(name, str) or not name:
        raise GraphError(f"a Variable needs a non-empty string name, got {name!r}")
    for key in attributes:
        if not (key.startswith("__") and key.endswith("__") and len(key) > 4):
            raise GraphError(f"Variable {name!r}: unknown argument {key!r}; extra "
                             f"attributes must be named __<key>__ (as __layout__)")
    if attributes:
        attr = {**(attr or {}), **{key: str(value) for key, value in attributes.items()}}
    declared = _declared_attributes(lr_mult, wd_mult, dtype, init)
    if declared:
        attr = {**(attr or {}), **declared}
    if stype is not None:
        if stype not in ("default", "row_sparse", "csr"):
            raise GraphError(f"Variable {name!r}: stype must be 'default', 'row_sparse' or "
                             f"'csr', got {stype!r}")
        attr = dict(attr or {}, __storage_type__=str(STORAGE_TYPE_IDS[stype]))
    return variable_named(prefixed(name), shape, dtype, init, aux=aux, lr_mult=lr_mult,
                          wd_mult=wd_mult, attr=attr)


def _declared_attributes(lr_mult, wd_mult, dtype, init) -> dict:
    """The attributes MXNet's Variable stores for what it is given, as it writes them:
    ``__lr_mult__``/``__wd_mult__`` as given (``"2"``), ``__dtype__`` as MXNet's dtype code,
    ``__init__`` as the initializer's name or ``dumps()``."""
    found = {}
    for key, value in (("__lr_mult__", lr_mult), ("__wd_mult__", wd_mult)):
        if value is not None:
            found[key] = str(value)
    if dtype is not None and np.dtype(dtype).name in MXNET_DTYPE_CODES:
        found["__dtype__"] = str(MXNET_DTYPE_CODES[np.dtype(dtype).name])
    if isinstance(init, str):
        found["__init__"] = init
    elif init is not None and callable(getattr(init, "dumps", None)):
        found["__init__"] = init.dumps()
    return found


def variable_named(name: str, shape=None, dtype=None, init=None, *, aux: bool = False,
                   lr_mult: float | None = None, wd_mult: float | None = None,
                   attr: dict | None = None) -> Symbol:
    """:func:`Variable` with the name taken as it is (no prefix)."""
    attr = attribute.current().get(attr)
    info = {key: attr.pop(key) for key in _INFO_KEYS if key in attr}
    if attr:
        info[ATTRIBUTES] = {str(key): str(value) for key, value in attr.items()}
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)  # MXNet reads shape=1 as (1,)
    if shape is not None:  # 0 and -1: unknown (MXNet's legacy shapes say 0)
        info["shape"] = _unknown_as_none(shape)
    if dtype is not None:
        info["dtype"] = np.dtype(dtype).name
    if init is not None:
        info["init"] = create(init).spec()
    if aux:
        info["aux"] = True
    for key, value in (("lr_mult", lr_mult), ("wd_mult", wd_mult)):
        if value is not None:
            info[key] = float(value)
    return Symbol([(SymNode(None, name, info=info), 0)])


var = Variable

_prefixes: list[str] = []


@contextlib.contextmanager
def prefix(text: str):
    """Prepend ``text`` to the names of nodes and variables made inside:
    ``with sym.prefix("stage2_"): ...``; prefixes nest."""
    _prefixes.append(text)
    try:
        yield
    finally:
        _prefixes.pop()


def prefixed(name: str) -> str:
    return "".join(_prefixes) + name


def Group(symbols) -> Symbol:
    """One symbol whose outputs are the outputs of ``symbols``, in order."""
    outputs = []
    for symbol in symbols:
        if not isinstance(symbol, Symbol):
            raise GraphError(f"Group takes Symbols, got {symbol!r}")
        outputs.extend(symbol._outputs)
    if not outputs:
        raise GraphError("Group needs at least one symbol")
    return Symbol(outputs)


def constant(value, name: str | None = None) -> Symbol:
    """A constant tensor (an initializer of the lowered graph)."""
    array = np.asarray(value)
    if array.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
        array = array.astype(DEFAULT_DTYPE)  # Python floats mean the default float type
    name = name or f"_constant{next(_constant_ids)}"
    return Symbol([(SymNode("", name, info={"value": array}), 0)])


def scalar_like(value, like: Symbol) -> Symbol:
    """A Python number as a tensor of ``like``'s dtype, whatever that turns out to be
    (ONNX's CastLike), so ``x * 2`` works for float16 and float64 symbols alike."""
    if not isinstance(value, (int, float, np.number, bool)):
        raise GraphError(f"cannot combine a Symbol with {type(value).__name__} {value!r}; "
                         f"use a Symbol, a number or sym.constant(array)")
    # Kept exact (int64 or float64) until the cast: a float32 constant would round
    # ``x * (1 / math.sqrt(8))`` differently for float64 x than the imperative path does.
    exact = np.int64(value) if isinstance(value, (int, np.integer)) else np.float64(value)
    return _call_op("", "CastLike", [constant(exact), like], {})


def _listing(names: list[str], shown: int = 20) -> str:
    """Names for an error message, cut short when there are many (a network's internals)."""
    if len(names) <= shown:
        return str(names)
    return f"{names[:shown]} ... ({len(names) - shown} more; similar: " \
           f"{[n for n in names if n.endswith('_output')][-3:]})"
