"""Parameter shapes and dtypes from the nodes that read them: MXNet's backward inference.

MXNet infers a layer's weight from its data (``FullyConnected(data, num_hidden=10)``'s
weight is ``(10, data's features)``), where ONNX shape inference runs forward only. Two
kinds of rule give a variable of unknown shape one:

* the op that reads it fixes it (``_SHAPE_RULES``: a Conv's bias from its weight, a
  BatchNorm's statistics from the data's channels);
* the variable declares where its shape comes from (:data:`SHAPE_FROM`, written by
  :func:`shape_from` when an MXNet layer is built, kept in the symbol's JSON).

Symbol's shape and dtype inference (``symbol_inference.py``) asks these until nothing new
is learned. They read a symbol's nodes (``symbol_nodes.SymNode``) and the values' types,
never the Symbol class, so they sit below it and it imports them as it imports any module.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.runtime.passes.typecheck import shared_type_groups
from mixrt.sym.symbol_nodes import SymNode


def parameter_shapes(nodes: list[SymNode], types: dict) -> dict[str, tuple]:
    """{variable: shape} for variables of unknown shape whose shape their consumer fixes,
    or that declare where their shape comes from (:func:`shape_from`)."""
    found = _declared_sources(nodes, types)
    for node in nodes:
        rule = _SHAPE_RULES.get(node.op)
        if rule is None or node.domain:
            continue
        shapes = [_static_shape(types, entry) for entry in node.inputs]
        for index, shape in rule(shapes, node.attrs).items():
            entry = node.inputs[index] if index < len(node.inputs) else None
            if shape is None or entry is None or not entry[0].is_variable:
                continue
            if _static_shape(types, entry) is None and "shape" not in entry[0].info:
                found[entry[0].name] = tuple(shape)
    return found


def parameter_dtypes(nodes: list[SymNode], graph, types: dict, free: set) -> dict:
    """{variable in ``free`` (no dtype given): dtype} where its consumer fixes it, as
    MXNet's infer_type does (float64 data makes FullyConnected's weight float64):

    * a variable that declares where its shape comes from (an MXNet layer's parameter or
      label, :data:`SHAPE_FROM`) takes that value's dtype; a BatchNorm's parameters stay
      float32 for 16-bit data (``"min_float_bits"`` in the rule, MXNet's rule);
    * otherwise the ONNX schema binding it to one type parameter with operands whose dtype
      is known decides; a variable offered two dtypes keeps its own, and the type check
      names the clash."""
    declared = _declared_dtypes(nodes, types, free)
    offered: dict[str, set] = {}
    for node in graph.nodes:
        for name, dtype in _schema_offers(node, types, free):
            if name not in declared:
                offered.setdefault(name, set()).add(dtype)
    found = {name: dtypes.pop() for name, dtypes in offered.items() if len(dtypes) == 1}
    found.update(declared)
    return {name: dtype for name, dtype in found.items() if dtype != types[name].dtype}


def _declared_dtypes(nodes: list[SymNode], types: dict, free: set) -> dict:
    by_name = {node.name: node for node in nodes if not node.is_variable}
    found = {}
    for node in nodes:
        rule = node.info.get(SHAPE_FROM) if node.is_variable else None
        consumer = by_name.get(rule["node"]) if isinstance(rule, dict) else None
        if node.name not in free or consumer is None or \
                not 0 <= rule.get("input", -1) < len(consumer.inputs):
            continue
        entry = consumer.inputs[rule["input"]]
        dtype = getattr(types.get(entry[0].output_name(entry[1])), "dtype", None)
        if dtype is None or np.dtype(dtype).kind != "f":
            continue
        dtype = np.dtype(dtype)
        if dtype.itemsize * 8 < rule.get("min_float_bits", 0):
            dtype = np.dtype(np.float32)
        found[node.name] = dtype
    return found


def _schema_offers(node, types: dict, free: set):
    for group in shared_type_groups(node, types):
        given = {dtype for index, dtype in group
                 if node.inputs[index] not in free and dtype is not None}
        if len(given) == 1:
            yield from ((node.inputs[index], *given) for index, _ in group
                        if node.inputs[index] in free)


def _static_shape(types: dict, entry):
    if entry is None:
        return None
    value_type = types.get(entry[0].output_name(entry[1]))
    shape = getattr(value_type, "shape", None)
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) \
        else None


def _channels(shapes, attrs):
    x = shapes[0]
    channel = None if x is None or len(x) < 2 else (x[1],)
    return dict.fromkeys(range(1, len(shapes)), channel)


def _normalized(shapes, attrs):
    x = shapes[0]
    if x is None:
        return {}
    axis = attrs.get("axis", -1)
    return dict.fromkeys((1, 2), x[axis % len(x):])


def _conv_bias(shapes, attrs):
    w = shapes[1] if len(shapes) > 1 else None
    return {2: None if w is None else (w[0],)}


def _conv_transpose_bias(shapes, attrs):
    w = shapes[1] if len(shapes) > 1 else None
    return {2: None if w is None else (w[1] * attrs.get("group", 1),)}


def _gemm_bias(shapes, attrs):
    b = shapes[1] if len(shapes) > 1 else None
    return {2: None if b is None else (b[0] if attrs.get("transB", 0) else b[1],)}


_SHAPE_RULES = {"BatchNormalization": _channels, "InstanceNormalization": _channels,
                "LayerNormalization": _normalized, "Conv": _conv_bias,
                "ConvTranspose": _conv_transpose_bias, "Gemm": _gemm_bias}


# A variable may declare where its shape comes from, when the op that reads it cannot say
# (an MXNet layer's weight, read through a Transpose or a Reshape, or its label, which only
# a shape-only node reads). ``info[SHAPE_FROM]``, kept in the symbol's JSON:
#   {"node": name, "input": i, "dims": [...]}: the shape is built from input i of node
#   ``name``: each entry of "dims" is a whole number (that dimension as it is), ["axis", a]
#   or ["axis", a, d] (dimension a of that input, divided by d), ["linear", a, k, c]
#   (dimension a times k, plus c: a fused RNN's flat parameter vector), or
#   ["axes", start, stop] (its dimensions start:stop, as a Python slice; stop null for the
#   end).
# Dimensions the variable declares (Variable(shape=(128, None))) must agree with the rule's.
# Unless given, its dtype is that input's float dtype, float32 at least where the rule holds
# "min_float_bits": 32.
SHAPE_FROM = "shape_from"


def shape_from(node: str, input_index: int, dims: list, min_float_bits: int = 0) -> dict:
    """The ``info[SHAPE_FROM]`` entry for a variable whose shape (and, unless given, float
    dtype, at least ``min_float_bits`` wide) follows input ``input_index`` of node ``node``
    (see above)."""
    rule = {"node": node, "input": int(input_index), "dims": [
        int(d) if isinstance(d, (int, np.integer)) else list(d) for d in dims]}
    if min_float_bits:
        rule["min_float_bits"] = int(min_float_bits)
    return rule


def _declared_sources(nodes: list[SymNode], types: dict) -> dict[str, tuple]:
    by_name = {node.name: node for node in nodes if not node.is_variable}
    found = {}
    for node in nodes:
        rule = node.info.get(SHAPE_FROM) if node.is_variable else None
        if rule is None or _static_shape(types, (node, 0)) is not None:
            continue
        source = _source_shape(node.name, rule, by_name, types)
        shape = None if source is None else _shape_by_rule(node.name, rule["dims"], source)
        declared = node.info.get("shape")
        if shape is not None and declared is not None:
            shape = _merged(node.name, declared, shape)
        if shape is not None:
            found[node.name] = shape
    return found


def declared_shapes(nodes: list[SymNode], types: dict) -> dict[str, tuple]:
    """{value: shape, None where unknown} for every node, variable or not, that declares
    where its shape comes from (:data:`SHAPE_FROM`), as far as the source's shape is known:
    what shape inference checks the value against and learns it from."""
    by_name = {node.name: node for node in nodes if not node.is_variable}
    found = {}
    for node in nodes:
        rule = node.info.get(SHAPE_FROM)
        if rule is None:
            continue
        source = _source_shape(node.name, rule, by_name, types)
        if source is None:
            continue
        source = tuple(d if isinstance(d, int) else None for d in source)
        shape = _shape_by_rule(node.name, rule["dims"], source, partial=True)
        if None not in shape or any(d is not None for d in source):
            found[node.output_name(0)] = shape
        # else the source tells nothing yet: MXNet leaves a layer's parameter unknown,
        # ``()``, until its data has a shape, rather than half-shaped
    return found


def _source_shape(variable: str, rule, by_name: dict, types: dict):
    """The (possibly partly unknown) shape of the value the rule names; None when that node
    is not in this graph or its shape is not known yet."""
    if not isinstance(rule, dict) or not isinstance(rule.get("node"), str) \
            or type(rule.get("input")) is not int or not isinstance(rule.get("dims"), list):
        raise GraphError(f"variable {variable!r}: {SHAPE_FROM!r} must be {{'node': name, "
                         f"'input': index, 'dims': [...]}}, got {rule!r}")
    consumer = by_name.get(rule["node"])
    if consumer is None or not 0 <= rule["input"] < len(consumer.inputs):
        return None
    entry = consumer.inputs[rule["input"]]
    value_type = None if entry is None else types.get(entry[0].output_name(entry[1]))
    shape = getattr(value_type, "shape", None)
    return None if shape is None else tuple(shape)


def _shape_by_rule(variable: str, dims: list, source: tuple, partial: bool = False):
    shape = []
    for item in dims:
        if _whole(item):
            shape.append(item)
        elif isinstance(item, list) and item[:1] == ["axis"] and len(item) in (2, 3) \
                and _whole(item[1], signed=True) and all(_whole(d) and d for d in item[2:]):
            shape.append(_source_dim(variable, item, source))
        elif isinstance(item, list) and item[:1] == ["linear"] and len(item) == 4 \
                and _whole(item[1], signed=True) and _whole(item[2]) and _whole(item[3]):
            dim = _source_dim(variable, ["axis", item[1]], source)
            shape.append(dim if not isinstance(dim, int) else dim * item[2] + item[3])
        elif isinstance(item, list) and item[:1] == ["axes"] and len(item) == 3 \
                and all(d is None or _whole(d, signed=True) for d in item[1:]):
            shape.extend(source[slice(*item[1:])])
        else:
            raise GraphError(f"variable {variable!r}: bad {SHAPE_FROM!r} dimension {item!r}; "
                             f"expected a whole number, ['axis', a(, divisor)], "
                             f"['linear', a, k, c] or "
                             f"['axes', start, stop]")
    if partial:
        return tuple(d if isinstance(d, int) else None for d in shape)
    return tuple(shape) if all(isinstance(d, int) for d in shape) else None


def _whole(value, signed: bool = False) -> bool:
    return type(value) is int and (signed or value >= 0)


def _source_dim(variable: str, item: list, source: tuple):
    axis, divisor = item[1], item[2] if len(item) == 3 else 1
    if not -len(source) <= axis < len(source):
        raise GraphError(f"variable {variable!r}: its shape is taken from axis {axis} of a "
                         f"value of shape {source}, which has no such axis")
    dim = source[axis]
    if not isinstance(dim, int):
        return None
    if dim % divisor:
        raise GraphError(f"variable {variable!r}: its shape needs dimension {dim} (axis "
                         f"{axis} of {source}) divided by {divisor}, which does not divide it")
    return dim // divisor


def _merged(variable: str, declared: tuple, inferred: tuple) -> tuple:
    if len(declared) != len(inferred) or any(
            d is not None and d != i for d, i in zip(declared, inferred)):
        raise GraphError(f"variable {variable!r} is declared with shape {declared}, but its "
                         f"consumer needs {inferred}")
    return inferred
