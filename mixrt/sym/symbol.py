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
inference (``symbol_inference.py``), its JSON (``symbol_json.py``). An op call (``call_op``,
at the end: the node checked against the op's spec, and the Symbol of its outputs) is the
way every Symbol but a variable or a constant is made, so it lives here, and the per-op
functions of ``ops.py`` and the layers above call it. Only the Executor that binds a Symbol
(``executor.py``, built on NDArrays and sessions) stands above the class; it hands
``Executor`` and ``simple_bind`` in as it loads (``handed_in.py``).
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np

from mixrt import attribute, name as naming
from mixrt.array_methods import ArrayMethods, beyond_onnx_reshape
from mixrt.base import MXNET_DTYPE_CODES, STORAGE_TYPE_IDS, NotImplementedForSymbol
from mixrt.base.errors import GraphError
from mixrt.initializer import create
from mixrt.op_specs import OpSpec, spec_of
# symbol_module.hand_in, as the modules that hand things in call it
from mixrt.sym.handed_in import _HANDED_IN, _handed_in, hand_in  # noqa: F401
from mixrt.sym import symbol_json
from mixrt.sym.mxnet_arguments import mxnet_arguments
from mixrt.sym.partial_shapes import SAME_SHAPE
from mixrt.sym.symbol_inference import _unknown_as_none, SymbolInference
from mixrt.sym.symbol_lowering import SymbolLowering
from mixrt.sym.symbol_nodes import (  # noqa: F401  (the names mixrt.sym's modules import from here)
    _INFO_KEYS, _layer_inputs, ATTRIBUTES, DEFAULT_DTYPE, INPUT_ORDER, LAYER, LOSS_HEAD,
    MXNET_OP, MXNET_PARAMS, OUTPUT_SUFFIX, SymNode)
from mixrt.sym.symbol_structure import SymbolStructure


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
        made = call_op("", op_type, [left, right], {})
        if both:  # MXNet's Symbol arithmetic is elementwise: operands of one shape
            made._outputs[0][0].info[SAME_SHAPE] = "loose"
        return made


    def __neg__(self):
        return call_op("", "Neg", [self], {})

    def _op(self, op_type: str, inputs: list, attributes: dict) -> "Symbol":
        return call_op("", op_type, list(inputs), dict(attributes))

    def _named_op(self, kind: str, op_type: str, inputs: list, attributes: dict,
                  name: str | None = None, domain: str = "") -> "Symbol":
        return call_op(domain, op_type, list(inputs), dict(attributes),
                       name=layer_name(kind, name))

    def _named_reshape(self, codes: list[int], reverse: bool, name=None) -> "Symbol":
        if beyond_onnx_reshape(codes, reverse):
            return self._mxnet_reshape(codes, reverse, name)
        return self._named_op("reshape", "Reshape", [self, self._int_tensor(codes)], {},
                              name)

    def _mxnet_reshape(self, codes: list[int], reverse: bool, name=None) -> "Symbol":
        # a symbol's shape is known only when it runs, so the codes travel to the kernel
        # (its node, unnamed, is named for it: mxreshape0, which its errors name)
        return call_op("mixrt", "MXReshape", [self],
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
    return call_op("", "CastLike", [constant(exact), like], {})


def _listing(names: list[str], shown: int = 20) -> str:
    """Names for an error message, cut short when there are many (a network's internals)."""
    if len(names) <= shown:
        return str(names)
    return f"{names[:shown]} ... ({len(names) - shown} more; similar: " \
           f"{[n for n in names if n.endswith('_output')][-3:]})"


# -- one op call: its node, and the Symbol of its outputs ------------------------------------

# what MXNet calls a layer's parameters, by (op, ONNX input name); other inputs are named
# "<node>_<input in lower case>"
_PARAMETER_NAMES = {
    ("Conv", "W"): "weight", ("Conv", "B"): "bias",
    ("ConvTranspose", "W"): "weight", ("ConvTranspose", "B"): "bias",
    ("Gemm", "B"): "weight", ("Gemm", "C"): "bias", ("MatMul", "B"): "weight",
    ("BatchNormalization", "scale"): "gamma", ("BatchNormalization", "B"): "beta",
    ("BatchNormalization", "input_mean"): "moving_mean",
    ("BatchNormalization", "input_var"): "moving_var",
    ("LayerNormalization", "Scale"): "gamma", ("LayerNormalization", "B"): "beta",
    ("InstanceNormalization", "scale"): "gamma", ("InstanceNormalization", "B"): "beta",
    ("PRelu", "slope"): "alpha",
}
# inputs the op updates (as an output) rather than reads as a parameter: auxiliary states
_AUX_INPUTS = {("BatchNormalization", "input_mean"), ("BatchNormalization", "input_var")}


# -- node names -------------------------------------------------------------------------------

def _node_name(op_type: str, given: str | None, exact: bool = False) -> str:
    return prefixed(given if exact else layer_name(op_type, given))


def layer_name(kind: str, given: str | None) -> str:
    """``given``, or MXNet's automatic name: the kind in lower case and a counter per kind
    (``fullyconnected0``), as the current ``mixrt.name.NameManager`` gives them; without the
    ``sym.prefix`` (call_op adds it)."""
    return naming.current().get(given, kind.lower())


# -- calling an op ------------------------------------------------------------------------------

def call_op(domain: str, op_type: str, args: list, kwargs: dict, *, name: str | None = None,
            num_outputs: int | None = None, exact_name: bool = False) -> Symbol:
    """Add one node: ``args`` positional inputs, ``kwargs`` inputs by name, attributes, or
    MXNet's attributes of any symbol (``attr=``, ``lr_mult=``, ``__layout__=``, ...: stored
    on the node, see :func:`split_symbol_attributes`). ``exact_name``: ``name`` is final
    (a layer's inner node), not one for the name manager."""
    spec = spec_of(domain, op_type)
    node_name = _node_name(op_type, name, exact_name)
    kwargs, symbol_attributes = split_symbol_attributes(kwargs)
    args, kwargs = mxnet_arguments(spec, f"{op_type} {node_name!r}", args, kwargs)
    inputs, attributes = _split_arguments(spec, node_name, args, kwargs)
    count = _output_count(spec, node_name, attributes, num_outputs, inputs)
    entries = [_entry(spec, node_name, i, value, symbol_attributes)
               for i, value in enumerate(inputs)]
    node = SymNode(op_type, node_name, entries, attributes, spec.domain, spec.opset, count)
    if symbol_attributes:
        node.info[ATTRIBUTES] = symbol_attributes
    return Symbol([(node, i) for i in range(count)])


# MXNet's keywords that any operator takes, stored as the attribute ``__<key>__`` (and read
# back under both names)
SYMBOL_KEYWORDS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


def split_symbol_attributes(kwargs: dict) -> tuple[dict, dict]:
    """(the operator's own arguments, the symbol's attributes as strings): ``attr=`` (a
    dict), :data:`SYMBOL_KEYWORDS` and ``__<key>__`` keywords, over the current
    ``mixrt.attribute.AttrScope``'s."""
    own, given = {}, {}
    for key, value in kwargs.items():
        if key == "attr":
            given.update(_string_attributes(value))
        elif key in SYMBOL_KEYWORDS:
            given[f"__{key}__"] = str(value)
        elif key.startswith("__") and key.endswith("__") and len(key) > 4:
            given[key] = str(value)
        else:
            own[key] = value
    return own, attribute.current().get(given)


def _string_attributes(attr) -> dict:
    if attr is None:
        return {}
    if not isinstance(attr, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attr.items()):
        raise GraphError(f"attr must be a dict of strings to strings, got {attr!r}")
    return dict(attr)


def _split_arguments(spec: OpSpec, node_name: str, args, kwargs) -> tuple[list, dict]:
    label = f"{spec.op_type} {node_name!r}"
    if len(args) > len(spec.inputs) and not spec.variadic:
        raise GraphError(f"{label} takes at most {len(spec.inputs)} inputs "
                         f"{list(spec.inputs)}; got {len(args)}")
    inputs = list(args)
    attributes = {}
    for key, value in kwargs.items():
        if key in spec.inputs and not (spec.variadic and key == spec.inputs[-1]):
            index = spec.inputs.index(key)
            if index < len(args):
                raise GraphError(f"{label}: input {key!r} given both positionally and by name")
            inputs.extend([None] * (index + 1 - len(inputs)))
            inputs[index] = value
        elif key in spec.attributes or spec.any_attribute:
            attributes[key] = _attribute_value(value)
        else:
            raise GraphError(f"{label}: unknown argument {key!r}; inputs are "
                             f"{list(spec.inputs)}, attributes are {sorted(spec.attributes)}")
    fixed = len(spec.inputs) - (1 if spec.variadic else 0)
    inputs.extend([None] * (fixed - len(inputs)))
    return inputs, attributes


def _attribute_value(value):
    """Attributes as the importer would produce them: lists, Python scalars, arrays."""
    if isinstance(value, tuple):
        return [_attribute_value(v) for v in value]
    if isinstance(value, list):
        return [_attribute_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _output_count(spec: OpSpec, node_name: str, attributes: dict, asked, inputs) -> int:
    if "num_outputs" in spec.attributes and attributes.get("num_outputs") is not None:
        asked = asked or int(attributes["num_outputs"])
    if asked is not None:
        if int(asked) < 1:
            raise GraphError(f"{spec.op_type} {node_name!r}: num_outputs must be >= 1")
        return int(asked)
    if spec.default_outputs is None:
        split = inputs[1] if spec.op_type == "Split" and len(inputs) > 1 else None
        if split is not None and not isinstance(split, Symbol):
            return len(np.atleast_1d(np.asarray(split)))
        raise GraphError(f"{spec.op_type} {node_name!r} has a variable number of outputs; "
                         f"say how many with num_outputs=")
    return spec.default_outputs


def _entry(spec: OpSpec, node_name: str, index: int, value, symbol_attributes: dict):
    """One input of the new node: a Symbol's output, a constant, a missing optional input
    or (for a required input left out) a new Variable, with the node's attributes."""
    input_name = spec.inputs[min(index, len(spec.inputs) - 1)]
    if value is None:
        if index < spec.required:
            made = _auto_variable(spec, node_name, input_name)._outputs[0]
            if symbol_attributes:
                made[0].info[ATTRIBUTES] = dict(symbol_attributes)
            return made
        return None
    if isinstance(value, Symbol):
        if len(value) != 1:
            raise GraphError(f"{spec.op_type} {node_name!r}: input {input_name!r} got a "
                             f"symbol with {len(value)} outputs {value.list_outputs()}; "
                             f"index it to pick one")
        return value._outputs[0]
    return constant(value)._outputs[0]


def _auto_variable(spec: OpSpec, node_name: str, input_name: str) -> Symbol:
    role = _PARAMETER_NAMES.get((spec.op_type, input_name), input_name.lower())
    # node_name already carries the prefix
    return variable_named(f"{node_name}_{role}", aux=(spec.op_type, input_name) in _AUX_INPUTS)
