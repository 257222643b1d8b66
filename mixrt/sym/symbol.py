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
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from dataclasses import dataclass, field

import numpy as np

from mixrt import attribute
from mixrt.array_methods import ArrayMethods
from mixrt.base import STORAGE_TYPE_IDS, NotImplementedForSymbol
from mixrt.base.errors import GraphError, MixrtError, ShapeError
from mixrt.initializer import create
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.infer import infer_types
from mixrt.sym.partial_shapes import (completed_types, is_unknown, learned_shapes, SAME_SHAPE,
                                     unknown_dim)

DEFAULT_DTYPE = np.dtype(np.float32)  # a variable's dtype when nobody says otherwise
# node.info key of MXNet's symbol attributes (strings: ``attr=``, ``lr_mult``, AttrScope's),
# which list_attr/attr_dict show and operators never read
ATTRIBUTES = "attr"
# node.info key of a node that is part of an MXNet layer (sym.FullyConnected, ...): the layer's
# name, which is its output node's. MXNet's structural queries (get_children, get_internals)
# see the layer as that one node, as MXNet has it.
LAYER = "layer"
# keys of a Variable's ``attr=`` that are mixrt records of its own, not MXNet attributes
_INFO_KEYS = ("shape_from",)

# A Symbol's arithmetic, parameter-shape inference, JSON and binding are done by
# mixrt/sym/ops.py, serialize.py and executor.py, which build on this module. Each hands its
# functions in as it is imported (mixrt/sym/__init__.py imports them all), so this module
# imports none of them and no import loop ties them.
_HANDED_IN: dict = {}


def hand_in(**functions) -> None:
    _HANDED_IN.update(functions)


def _handed_in(name: str):
    return _HANDED_IN[name]


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


# an operator node's info key: the word its outputs are named by, where MXNet's operator
# names them otherwise than ``<node>_output`` (make_loss: ``<node>_loss``)
OUTPUT_SUFFIX = "output_suffix"
# an operator node's info key: the node is a loss head (make_loss, MakeLoss), whose
# gradient MXNet fixes whatever head gradient backward is given
LOSS_HEAD = "loss_head"
# an operator node's info key: the order (input positions) MXNet's structure lists its
# inputs in, where it is not the node's own (an Embedding's Gather reads the weight first;
# MXNet lists data, then weight)
INPUT_ORDER = "input_order"
# an operator node's info key: the MXNet operator it was made for (``FullyConnected``,
# ``Pooling``), which MXNet's op hook reports; a node without it reports its own op
MXNET_OP = "mxnet_op"
# an operator node's info key: the parameters an MXNet layer was given (strings, as MXNet
# keeps them: ``{"num_hidden": "10"}``), which list_attr shows in place of the node's ONNX
# attributes; MXNet copies them onto the Variables a layer makes for its inputs, so those
# carry them too
MXNET_PARAMS = "mxnet_params"
# MXNet's dtype codes (mshadow's TypeFlag), which a variable's ``__dtype__`` holds
MXNET_DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "uint8": 3, "int32": 4,
                     "int8": 5, "int64": 6, "bool": 7, "int16": 8, "uint16": 9, "uint32": 10,
                     "uint64": 11}
# MXNet's attributes that it stores as ``__<key>__`` and lists under both names
HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


@dataclass(eq=False)
class SymNode:
    """One node of a symbol's DAG. ``op`` is None for a variable, "" for a constant."""

    op: str | None
    name: str
    inputs: list = field(default_factory=list)  # (SymNode, output index) or None (missing)
    attrs: dict = field(default_factory=dict)  # operator attributes
    domain: str = ""
    opset: int = 0
    num_outputs: int = 1
    # variables: declared shape / dtype / initializer / aux flag / lr and wd multipliers;
    # constants: "value"
    info: dict = field(default_factory=dict)

    @property
    def is_variable(self) -> bool:
        return self.op is None

    @property
    def is_constant(self) -> bool:
        return self.op == ""

    def output_name(self, index: int) -> str:
        if self.is_variable or self.is_constant:
            return self.name
        suffix = self.info.get(OUTPUT_SUFFIX, "output")
        return f"{self.name}_{suffix}" if self.num_outputs == 1 else \
            f"{self.name}_{suffix}{index}"


def _inputs_in_listed_order(node: SymNode) -> list:
    order = node.info.get(INPUT_ORDER)
    return node.inputs if order is None else [node.inputs[i] for i in order]


_constant_ids = itertools.count()


class Symbol(ArrayMethods):
    """Outputs of a DAG of SymNodes (one for most ops, several for a Group or a multi-output
    op). Immutable: composition and indexing make new Symbols that share nodes."""

    def __init__(self, outputs: list[tuple[SymNode, int]]):
        self._outputs = list(outputs)

    # -- naming and structure ------------------------------------------------------------

    @property
    def name(self) -> str | None:
        """The node's name when the symbol has a single output, else None."""
        return self._outputs[0][0].name if len(self._outputs) == 1 else None

    def list_outputs(self) -> list[str]:
        return [node.output_name(index) for node, index in self._outputs]

    def list_arguments(self) -> list[str]:
        """Variables that are not auxiliary states, in the order a depth-first walk from the
        outputs meets them (MXNet's order)."""
        return [n.name for n in self._variables() if not n.info.get("aux")]

    def list_auxiliary_states(self) -> list[str]:
        """Variables the operators update rather than differentiate (BatchNormalization's
        running mean and variance)."""
        return [n.name for n in self._variables() if n.info.get("aux")]

    def list_inputs(self) -> list[str]:
        return [n.name for n in self._variables()]

    def list_attr(self, recursive: bool = False) -> dict:
        """The first output node's attributes as strings (MXNet's): those it was given
        (``attr=``, ``lr_mult=``, an AttrScope's), a variable's ``__shape__`` and
        multipliers, an MXNet layer's parameters (another operator's own attributes); the
        ones MXNet stores as ``__<key>__`` (``__lr_mult__``) also under their plain key.
        ``recursive``: every node's, keyed ``<node>_<key>``."""
        if recursive:
            return {f"{node}_{key}": value for node, found in self.attr_dict().items()
                    for key, value in found.items()}
        if not self._outputs:
            raise GraphError("list_attr needs a symbol with an output")
        return _attributes(self._outputs[0][0])

    def attr(self, key: str):
        """The attribute ``key`` of the output node (a string; ``"name"``: the node's
        name), or None, as for a group of several nodes."""
        nodes = {id(node) for node, _ in self._outputs}
        if len(nodes) != 1:
            return None
        if key == "name":
            return self._outputs[0][0].name
        return self.list_attr().get(key)

    def attr_dict(self) -> dict:
        """{node name: its attributes} for every node that has some (a layer is one node,
        as in MXNet)."""
        found = {}
        for node in self._topological():
            attributes = _attributes(node) if _listed(node) else None
            if attributes:
                found[node.name] = attributes
        return found

    def _set_attr(self, **attributes) -> None:
        """Set attributes (strings) of the single output node, in place, as MXNet does:
        ``name`` renames the node, and MXNet's hidden keys (``lr_mult``) are stored as
        ``__lr_mult__``."""
        node = self._single_node("_set_attr")
        for key, value in attributes.items():
            if not isinstance(value, str):
                raise attribute.AttributeValueError(
                    f"_set_attr: attribute {key!r} must be a string, got "
                    f"{type(value).__name__} {value!r}")
            if key == "name":
                node.name = value
            else:
                node.info.setdefault(ATTRIBUTES, {})[_stored_key(key, value)] = value

    def get_internals(self) -> "Symbol":
        """Every output of every node, in topological order: pick one by name
        (``net.get_internals()["relu1_output"]``) to get a feature extractor. A layer
        (``sym.FullyConnected``) is one node here, as in MXNet; constants are not listed."""
        return Symbol([(node, i) for node in self._topological() if _listed(node)
                       for i in range(node.num_outputs)])

    def get_children(self) -> "Symbol | None":
        """The inputs of the output nodes (of a layer: the layer's inputs), None for a
        variable."""
        inputs, seen = [], set()
        for node, _ in self._outputs:
            if id(node) not in seen:
                seen.add(id(node))
                inputs.extend(_layer_inputs(node))
        return Symbol(inputs) if inputs else None

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

    def _single_node(self, what: str) -> SymNode:
        if len(self._outputs) != 1:
            raise GraphError(f"{what} needs a symbol with one output; this one has "
                             f"{len(self._outputs)}: {self.list_outputs()}")
        return self._outputs[0][0]

    def _topological(self) -> list[SymNode]:
        """Nodes in dependency order (iterative depth-first post-order, so deep networks do
        not hit Python's recursion limit)."""
        order, seen = [], set()
        for root, _ in self._outputs:
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if id(node) in seen:
                    continue
                if expanded:
                    seen.add(id(node))
                    order.append(node)
                    continue
                stack.append((node, True))
                for entry in reversed(_inputs_in_listed_order(node)):
                    if entry is not None and id(entry[0]) not in seen:
                        stack.append((entry[0], False))
        return order

    def _variables(self) -> list[SymNode]:
        return [n for n in self._topological() if n.is_variable]

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
        if reverse or any(d < -1 for d in codes) or codes.count(-1) > 1:
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

    # -- lowering ------------------------------------------------------------------------

    def to_graph(self, params: dict | None = None, *, name: str = "sym",
                 shapes: dict | None = None, dtypes: dict | None = None) -> Graph:
        """The symbol as a Graph: variables become graph inputs (those in ``params`` become
        initializers holding the given arrays), constants initializers, outputs the graph's
        outputs. ``shapes``/``dtypes`` override variables' declared types."""
        params, shapes, dtypes = params or {}, shapes or {}, dtypes or {}
        distinct = self._distinct()
        if distinct is not self:
            return distinct.to_graph(params, name=name, shapes=shapes, dtypes=dtypes)
        graph = Graph(name)
        nodes = self._topological()
        for node in nodes:
            if node.is_variable:
                _add_variable(graph, node, params, shapes, dtypes)
            elif node.is_constant:
                graph.initializers[node.name] = node.info["value"]
            else:
                graph.nodes.append(_graph_node(node))
        graph.outputs = [Value(n.output_name(i)) for n, i in self._outputs]
        graph.opsets = _opsets(nodes)
        graph.validate()
        _settle_scalars(graph)
        return graph

    # -- inference -----------------------------------------------------------------------

    def infer_type(self, *args, **kwargs):
        """(argument dtypes, output dtypes, auxiliary dtypes) from the given argument dtypes
        (positional in ``list_arguments()`` order, or by name) and the declared ones; a
        variable nothing decides is float32 (what ``simple_bind`` allocates it as)."""
        dtypes = self._named("infer_type", args, kwargs)
        types = self._inferred(shapes={}, dtypes=dtypes)
        return self._report(types, lambda t: None if t is None else t.dtype)

    def infer_type_partial(self, *args, **kwargs):
        """Like :meth:`infer_type`, with None for every dtype that depends on a variable
        whose dtype nobody gives or decides (MXNet's): ``Cast(data, dtype="float32")``
        knows its output and a following layer's parameters, not ``data``."""
        dtypes = self._named("infer_type_partial", args, kwargs)
        assumed = self._report(self._inferred(shapes={}, dtypes=dtypes), _dtype_of)
        try:  # what changes with the dtype assumed for undecided variables is unknown
            probed = self._report(
                self._inferred(shapes={}, dtypes=dtypes, undecided=np.dtype(np.float64)),
                _dtype_of)
        except MixrtError:  # an op refusing float64 says nothing of what it depends on
            return assumed
        return tuple([a if a == b else None for a, b in zip(first, second)]
                     for first, second in zip(assumed, probed))

    def infer_shape(self, *args, **kwargs):
        """(argument shapes, output shapes, auxiliary shapes) from the given argument shapes
        and the declared ones. When some shape stays unknown, MXNet's answer: a warning
        naming the arguments still unknown and ``(None, None, None)``; a contradiction is
        a ShapeError."""
        result = self._known_shapes(args, kwargs)
        if all(_complete(shape) for shapes in result for shape in shapes):
            return result
        unknown = _unknown_arguments(self, result[0])
        if not unknown:  # every argument known and still no output shape: they disagree
            given = dict(zip(self.list_arguments(), result[0]))
            raise ShapeError(f"infer_shape: the outputs {self.list_outputs()} have no shape "
                             f"for the argument shapes {given}; their operators do not "
                             f"accept them together")
        warnings.warn(f"infer_shape: cannot decide the shapes of arguments {unknown} (0 "
                      f"is an unknown dimension); give them as inputs", stacklevel=2)
        return None, None, None

    def infer_shape_partial(self, *args, **kwargs):
        """Like :meth:`infer_shape`, reporting what stays unknown as MXNet does: an
        unknown dimension as 0, a shape of unknown rank as ``()``."""
        return tuple([_mxnet_shape(shape) for shape in shapes]
                     for shapes in self._known_shapes(args, kwargs))

    def _known_shapes(self, args, kwargs):
        """Shape inference with None for an unknown dimension and for a shape of unknown
        rank (mixrt's own convention, which its callers read)."""
        shapes = self._named("infer_shape", args, kwargs)
        types = self._inferred(shapes=shapes, dtypes={})
        return self._report(types, lambda t: None if t is None else t.shape)

    def _named(self, what: str, args, kwargs) -> dict:
        arguments = self.list_arguments()
        if len(args) > len(arguments):
            raise GraphError(f"{what}: the symbol has {len(arguments)} arguments "
                             f"{arguments}; got {len(args)} positional values")
        named = dict(zip(arguments, args))
        unknown = set(kwargs) - set(self.list_inputs())
        if unknown:
            raise GraphError(f"{what}: the symbol has no variables {sorted(unknown)}; its "
                             f"variables are {self.list_inputs()}")
        named.update(kwargs)
        return named

    def _inferred(self, shapes: dict, dtypes: dict, undecided=None) -> dict:
        """Types of every value. Forward inference first, each unknown dimension of a
        variable carried as a symbol of its own; then what the graph says of the variables
        from the other direction (``partial_shapes``: operands of one shape, an output's
        shape read back into an input's, parameters whose shape follows from their
        consumer, as BatchNormalization's gamma from the data's channels); variables of no
        given dtype take the one of an operand they must match (float64 data makes
        FullyConnected's weight float64, as in MXNet); and inference runs again.
        ``undecided``: the dtype assumed for variables nothing decides (else float32)."""
        shapes = {name: _unknown_as_none(shape) for name, shape in shapes.items()}
        dtypes = dict(dtypes)
        symbol = self._distinct()
        nodes = symbol._topological()
        variables = [n for n in nodes if n.is_variable]
        free = {n.name for n in variables if "dtype" not in n.info} - set(dtypes)
        while True:
            given = {n.name: shapes.get(n.name, n.info.get("shape")) for n in variables}
            assumed = {name: undecided for name in free} if undecided is not None else {}
            graph = symbol.to_graph(shapes=_with_unknown_dims(given),
                                    dtypes={**assumed, **dtypes})
            types = infer_types(graph)
            declared = _handed_in("declared_shapes")(nodes, types)
            found = learned_shapes(nodes, types, given, declared)
            for name, shape in _handed_in("parameter_shapes")(nodes, types).items():
                if name not in shapes and not _complete(found.get(name, given[name])):
                    found[name] = shape
            matched = _handed_in("parameter_dtypes")(nodes, graph, types, free)
            if not found and not matched:
                return completed_types(nodes, types, declared)
            shapes.update(found)
            dtypes.update(matched)
            free -= set(matched)

    def _report(self, types: dict, pick):
        """What ``types`` (of the graph ``to_graph`` makes) says of each argument, output
        and auxiliary state, by node: two nodes of one name are reported each its own."""
        distinct = self._distinct()

        def of(names):
            return [pick(_known_dims(_tensor(types.get(name)))) for name in names]
        return (of(distinct.list_arguments()), of(distinct.list_outputs()),
                of(distinct.list_auxiliary_states()))

    def _distinct(self) -> "Symbol":
        """This symbol, or where two nodes share a name (MXNet allows it: a layer name
        used twice), a copy whose later namesakes are ``<name>_<k>``: the names its graph
        and its inference use. The copy lists its nodes in this symbol's order."""
        nodes = self._topological()
        renamed, taken = {}, set()
        for node in nodes:
            name, k = node.name, 0
            while not taken.isdisjoint(_value_names(node, name)):
                k += 1
                name = f"{node.name}_{k}"
            if name != node.name:
                renamed[id(node)] = name
            taken.update(_value_names(node, name))
        if not renamed:
            return self
        copies: dict[int, SymNode] = {}
        for node in nodes:
            inputs = [None if e is None else (copies[id(e[0])], e[1]) for e in node.inputs]
            copies[id(node)] = SymNode(node.op, renamed.get(id(node), node.name), inputs,
                                       dict(node.attrs), node.domain, node.opset,
                                       node.num_outputs, dict(node.info))
        _rename_references(nodes, copies)
        return Symbol([(copies[id(node)], index) for node, index in self._outputs])

    # -- saving --------------------------------------------------------------------------

    def tojson(self) -> str:
        return _handed_in("to_json")(self)

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
        self._outputs = _handed_in("from_json")(state["json"], "pickled Symbol")._outputs

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
        info["shape"] = tuple(None if d is None or d in (0, -1) else int(d) for d in shape)
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


# -- MXNet's view of the structure: a layer is one node ------------------------------------------

def _listed(node: SymNode) -> bool:
    """Whether MXNet would list the node: not a constant, not a layer's inner node."""
    return not node.is_constant and node.info.get(LAYER, node.name) == node.name


def _layer_inputs(node: SymNode) -> list:
    """The entries ``node`` reads; for a layer's output node, those the layer reads from
    outside (its data and parameters), in the order met walking back from ``node``."""
    layer = node.info.get(LAYER)
    found, seen = [], set()

    def walk(current: SymNode) -> None:
        for entry in current.inputs:
            if entry is None or entry[0].is_constant:
                continue
            inner = layer is not None and entry[0].info.get(LAYER) == layer \
                and not entry[0].is_variable
            if inner:
                walk(entry[0])
            elif (id(entry[0]), entry[1]) not in seen:
                seen.add((id(entry[0]), entry[1]))
                found.append(entry)

    walk(node)
    return found


# -- attributes --------------------------------------------------------------------------------

def _attributes(node: SymNode) -> dict:
    """A node's attributes as MXNet lists them: strings, the keywords MXNet stores as
    ``__<key>__`` under both names."""
    found = {}
    if node.is_variable:
        if node.info.get("shape") is not None:
            found["__shape__"] = str(tuple(0 if d is None else d for d in node.info["shape"]))
        for key in ("lr_mult", "wd_mult"):
            if key in node.info:
                found[f"__{key}__"] = str(node.info[key])
        found.update(node.info.get(MXNET_PARAMS, {}))
    elif MXNET_PARAMS in node.info:
        found.update(node.info[MXNET_PARAMS])
    elif not node.is_constant:
        found.update({key: _attribute_text(value) for key, value in node.attrs.items()})
    for key, value in node.info.get(ATTRIBUTES, {}).items():  # MXNet stores lr_mult so too
        found[f"__{key}__" if key in HIDDEN_KEYS else key] = value
    for key in HIDDEN_KEYS:
        if f"__{key}__" in found:
            found[key] = found[f"__{key}__"]
    return found


def _stored_key(key: str, value: str) -> str:
    """The key MXNet stores an attribute under: a hidden key (``lr_mult``) as
    ``__lr_mult__``; one ending in a hidden key (``fc_lr_mult``) is refused, as MXNet
    refuses it (set it on the Variable instead)."""
    for hidden in HIDDEN_KEYS:
        if key == hidden:
            return f"__{key}__"
        if key.endswith(hidden):
            raise GraphError(f"setting variable attributes with {key} is no longer "
                             f"supported (as in MXNet); use w = Variable(name, {hidden}="
                             f"{value}) and pass w as the layer's input")
    return key


def _attribute_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return str(tuple(value))
    return str(value)


# -- lowering helpers ------------------------------------------------------------------------

def _rename_references(nodes: list[SymNode], copies: dict) -> None:
    """In a renamed copy, the node names that nodes' records hold (the layer a node is
    part of, the consumer a parameter's shape rule reads) follow the renaming: each means
    the namesake its node feeds, directly or through the layer's inner nodes."""
    consumers: dict[int, list] = {}
    for node in nodes:
        for entry in node.inputs:
            if entry is not None:
                consumers.setdefault(id(entry[0]), []).append(node)
    for node in nodes:
        copy = copies[id(node)]
        if isinstance(node.info.get(LAYER), str):
            copy.info[LAYER] = _fed_namesake(node, node.info[LAYER], consumers, copies)
        rule = node.info.get(_INFO_KEYS[0])
        if isinstance(rule, dict) and isinstance(rule.get("node"), str):
            copy.info[_INFO_KEYS[0]] = {
                **rule, "node": _fed_namesake(node, rule["node"], consumers, copies)}


def _fed_namesake(node: SymNode, name: str, consumers: dict, copies: dict) -> str:
    """The new name of the first node called ``name`` that ``node`` is or feeds."""
    queue, seen = [node], set()
    while queue:
        current = queue.pop(0)
        if current.name == name:
            return copies[id(current)].name
        if id(current) not in seen:
            seen.add(id(current))
            queue.extend(consumers.get(id(current), []))
    return name


def _value_names(node: SymNode, name: str) -> list[str]:
    """The names ``node``'s outputs would have were the node named ``name``."""
    return [SymNode(node.op, name, num_outputs=node.num_outputs).output_name(i)
            for i in range(node.num_outputs)]


def _add_variable(graph: Graph, node: SymNode, params, shapes, dtypes) -> None:
    if node.name in params:
        graph.initializers[node.name] = np.asarray(params[node.name])
        return
    shape = shapes.get(node.name, node.info.get("shape"))
    dtype = dtypes.get(node.name, node.info.get("dtype", DEFAULT_DTYPE))
    if shape is not None:  # a str is a symbolic dimension (partial_shapes.unknown_dim)
        shape = tuple(None if d is None or d == -1 else d if isinstance(d, str) else int(d)
                      for d in shape)
    graph.inputs.append(Value(node.name, TensorType(np.dtype(dtype), shape)))


def _graph_node(node: SymNode) -> Node:
    inputs = ["" if entry is None else entry[0].output_name(entry[1])
              for entry in node.inputs]
    while inputs and inputs[-1] == "":
        inputs.pop()
    return Node(node.op, inputs, [node.output_name(i) for i in range(node.num_outputs)],
                name=node.name, domain=node.domain, opset=node.opset,
                attributes=dict(node.attrs))


def _settle_scalars(graph: Graph) -> None:
    """Python numbers in arithmetic became CastLike(constant, operand); where inference
    knows the operand's dtype, the constant is simply stored in it, so the graph carries no
    cast (and exports to opsets older than CastLike)."""
    casts = [n for n in graph.nodes if n.op_type == "CastLike" and not n.domain
             and n.inputs[0] in graph.initializers]
    if not casts:
        return
    types = infer_types(graph)
    readers = [name for node in graph.nodes for name in node.inputs]
    for node in casts:
        dtype = getattr(types.get(node.inputs[1]), "dtype", None)
        if dtype is None or readers.count(node.inputs[0]) != 1 \
                or node.outputs[0] in graph.output_names:
            continue
        value = graph.initializers.pop(node.inputs[0])
        graph.initializers[node.outputs[0]] = value.astype(dtype)
        graph.nodes.remove(node)


def _opsets(nodes: list[SymNode]) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for node in nodes:
        if not (node.is_variable or node.is_constant):
            opsets[node.domain] = max(opsets.get(node.domain, 0), node.opset)
    return opsets


def _listing(names: list[str], shown: int = 20) -> str:
    """Names for an error message, cut short when there are many (a network's internals)."""
    if len(names) <= shown:
        return str(names)
    return f"{names[:shown]} ... ({len(names) - shown} more; similar: " \
           f"{[n for n in names if n.endswith('_output')][-3:]})"


def _tensor(value_type):
    return value_type if isinstance(value_type, TensorType) else None


def _known_dims(value_type):
    """The type with the symbols of unknown dimensions reported as None."""
    if value_type is None or value_type.shape is None:
        return value_type
    return value_type.with_shape(tuple(None if is_unknown(d) else d for d in value_type.shape))


def _unknown_as_none(shape):
    """A shape given to inference: 0 and -1 mean unknown (MXNet's legacy shapes)."""
    if shape is None:
        return None
    return tuple(None if d is None or d in (0, -1) else int(d) for d in shape)


def _with_unknown_dims(shapes: dict) -> dict:
    """Each variable's unknown dimensions as symbols of their own, for forward inference
    to carry (``partial_shapes.unknown_dim``)."""
    return {name: None if shape is None else tuple(
        unknown_dim(name, axis) if d is None else d for axis, d in enumerate(shape))
        for name, shape in shapes.items()}


def _dtype_of(value_type):
    return None if value_type is None else value_type.dtype


def _mxnet_shape(shape) -> tuple:
    """A shape as MXNet's legacy inference reports it: 0 for an unknown dimension, ``()``
    for an unknown rank."""
    return () if shape is None else tuple(0 if d is None else d for d in shape)


def _unknown_arguments(symbol: "Symbol", arg_shapes: list) -> dict:
    """{argument: its partial shape in MXNet's notation} for those not fully known."""
    return {name: _mxnet_shape(shape) for name, shape in zip(symbol.list_arguments(), arg_shapes)
            if not _complete(shape)}


def _complete(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)
