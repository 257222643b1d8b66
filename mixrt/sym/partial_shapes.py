"""Shapes inferred both ways, with unknown dimensions, as MXNet's ``infer_shape`` does.

MXNet (legacy shapes) writes an unknown dimension as 0: ``Variable("a", shape=(0, 10))``.
Forward inference (``runtime/passes/infer``) carries each unknown dimension of a variable as
a symbol of its own (``"?a:0"``), so ``a + b`` knows that its operands share one. This module
then learns from the other direction, walking the graph from its outputs:

* operands that must have the output's shape (MXNet's elementwise operators, unary ops, an
  ``elemwise_add``, an identity "like" another value) form one shape; a known dimension fixes
  the symbol on the other side, two known ones that differ are a ShapeError naming the node;
* per operator, what an output's shape says of an input's: a product's rows, a flattened
  batch, a stride-1 convolution's image size, a concatenation's or split's parts, the axes a
  squeeze or transpose moved;
* a value that declares where its shape comes from (``parameter_rules.SHAPE_FROM``: an MXNet layer's
  weight from ``num_hidden`` and the data) gets that shape.

:func:`learned_shapes` returns what the variables gain; ``Symbol._inferred`` runs forward
inference again with it until nothing changes.
"""

from __future__ import annotations

from mixrt.base.errors import ShapeError

# node.info key: the node's operands and outputs have one shape. "strict": MXNet's
# elementwise functions (a mismatch is an error); "loose": Symbol arithmetic, which may also
# broadcast in mixrt (a group that does not agree is left to the operator's own rule).
SAME_SHAPE = "same_shape"

# ops whose output 0 has the shape of their input 0
_LIKE_INPUT = frozenset({
    "Relu", "Sigmoid", "Tanh", "Identity", "Abs", "Neg", "Exp", "Log", "Sqrt", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Floor", "Ceil",
    "Round", "Sign", "Reciprocal", "Erf", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu",
    "HardSigmoid", "Softmax", "LogSoftmax", "Dropout", "BatchNormalization", "Cast",
    "CastLike", "LRN", "InstanceNormalization", "LayerNormalization", "Clip", "Not",
    "IsNaN", "IsInf", "BlockGrad", "Mish", "Gelu", "HardSwish", "Celu", "ThresholdedRelu",
    "PRelu"})


def unknown_dim(variable: str, axis: int) -> str:
    """The symbol an unknown dimension of a variable carries through forward inference."""
    return f"?{variable}:{axis}"


def is_unknown(dim) -> bool:
    return dim is None or isinstance(dim, str)


class _Dims:
    """Union-find over symbolic dimensions, each class bound to a number once known."""

    def __init__(self):
        self.parent: dict[str, object] = {}

    def resolve(self, dim):
        while isinstance(dim, str) and dim in self.parent:
            dim = self.parent[dim]
        return dim

    def shape(self, shape):
        return None if shape is None else tuple(self.resolve(d) for d in shape)

    def unify(self, a, b, where: str):
        a, b = self.resolve(a), self.resolve(b)
        if a is None or a == b:
            return b
        if b is None:
            return a
        if isinstance(a, str):
            self.parent[a] = b
            return b
        if isinstance(b, str):
            self.parent[b] = a
            return a
        raise ShapeError(f"{where}: dimension {a} does not match {b}")

    def merged(self, shapes: list, where: str):
        """One shape all of ``shapes`` agree with (None: nothing known)."""
        known = [s for s in shapes if s is not None]
        if not known:
            return None
        ranks = {len(s) for s in known}
        if len(ranks) > 1:
            raise ShapeError(f"{where}: shapes {known} must be one shape")
        result = list(known[0])
        for shape in known[1:]:
            result = [self.unify(a, b, f"{where}: shapes {known}")
                      for a, b in zip(result, shape)]
        return self.shape(tuple(result))


def learned_shapes(nodes: list, types: dict, variable_shapes: dict,
                   declared: dict) -> dict:
    """{variable: shape} for variables whose shape the graph tells more of than
    ``variable_shapes`` (their shapes as given, None for unknown dims). ``types`` are
    forward inference's; ``declared``: {value: shape} of values that declare their shape."""
    dims, known = _propagated(nodes, types, declared)
    found = {}
    for name, given in variable_shapes.items():
        shape = dims.shape(known.get(name))
        if shape is None:
            continue
        shape = tuple(None if is_unknown(d) else d for d in shape)
        if given is None or (len(given) == len(shape) and any(
                g is None and d is not None for g, d in zip(given, shape))):
            found[name] = shape
    return found


def completed_types(nodes: list, types: dict, declared: dict) -> dict:
    """``types`` with the shapes that forward inference left unknown and the other
    direction knows (an elementwise operator's output from its other operand, as MXNet's
    bidirectional inference reports it)."""
    dims, known = _propagated(nodes, types, declared)
    completed = dict(types)
    for name, value_type in types.items():
        if getattr(value_type, "shape", ()) is not None or known.get(name) is None:
            continue
        shape = tuple(None if is_unknown(d) else d for d in dims.shape(known[name]))
        completed[name] = value_type.with_shape(shape)
    return completed


def _propagated(nodes: list, types: dict, declared: dict):
    """What forward inference and the graph's backward rules together say of each value's
    shape: the union-find of dimensions and {value: shape}."""
    dims = _Dims()
    known = {name: tuple(t.shape) for name, t in types.items()
             if getattr(t, "shape", None) is not None}
    for value, shape in declared.items():
        known[value] = dims.merged([known.get(value), shape], f"value {value!r}")
    for node in reversed(nodes):
        if node.is_variable or node.is_constant:
            continue
        for group, strict in _same_shape_groups(node):
            _join(dims, known, group, strict, node)
        for value, shape in _backward(node, known).items():
            known[value] = dims.merged([known.get(value), shape],
                                       f"{node.op} {node.name!r}: input {value!r}")
    for node in nodes:  # and forward again: what an operand learned reaches its consumers
        if not (node.is_variable or node.is_constant):
            for group, strict in _same_shape_groups(node):
                _join(dims, known, group, strict, node)
    return dims, known


def _join(dims: _Dims, known: dict, group: list, strict: bool, node) -> None:
    try:
        merged = dims.merged([dims.shape(known.get(v)) for v in group],
                             f"{node.op} {node.name!r}")
    except ShapeError:
        if strict:
            raise
        return  # broadcasting, which the operator's own shape rule checks
    if merged is not None:
        for value in group:
            known[value] = merged


def _value(entry) -> str | None:
    return None if entry is None else entry[0].output_name(entry[1])


def _same_shape_groups(node):
    """Groups of value names that share one shape, and whether a mismatch is an error."""
    mode = node.info.get(SAME_SHAPE)
    output = node.output_name(0)
    if mode:
        members = [_shape_source(entry) for entry in node.inputs if entry is not None]
        yield [v for v in members if v is not None] + [output], mode == "strict"
    elif node.op in _LIKE_INPUT and node.inputs and node.inputs[0] is not None:
        yield [_value(node.inputs[0]), output], False


def _shape_source(entry) -> str | None:
    """The value an operand stands for: a Shape node's operand counts as the tensor it was
    taken from (``Expand(x, Shape(y))`` is x in y's shape); constants have their own."""
    node, index = entry
    if node.is_constant:
        return None
    if node.op == "Shape" and not node.domain and not node.attrs and node.inputs:
        return _value(node.inputs[0])
    return node.output_name(index)


# -- what an output's shape says of an input's ---------------------------------------------

def _backward(node, known: dict) -> dict:
    rule = _RULES.get(node.op) if not node.domain else None
    if rule is None:
        return {}
    outputs = [known.get(node.output_name(i)) for i in range(node.num_outputs)]
    inputs = [None if e is None else known.get(_value(e)) for e in node.inputs]
    found = {}
    for index, shape in rule(node, inputs, outputs).items():
        entry = node.inputs[index] if index < len(node.inputs) else None
        if entry is not None and shape is not None:
            found[_value(entry)] = tuple(shape)
    return found


def _gemm(node, inputs, outputs):
    out, a = outputs[0], inputs[0]
    if out is None:
        return {}
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    rows = (None, out[0]) if trans_a else (out[0], None)
    found = {0: rows}
    inner = a[0 if trans_a else 1] if a is not None and len(a) == 2 else None
    # the weight only once the data fixes its inner dimension, as MXNet's FullyConnected
    # (an MXNet weight whose data has no shape yet stays unknown, ``()``, not (out, 0))
    if inner is not None and not is_unknown(inner):
        found[1] = (out[1], inner) if trans_b else (inner, out[1])
    return found


def _flatten(node, inputs, outputs):
    out, x = outputs[0], inputs[0]
    axis = node.attrs.get("axis", 1)
    if out is None or x is None or axis < 0:
        return {}
    shape = [None] * len(x)
    if axis == 1 and len(x) > 1:
        shape[0] = out[0]
    if axis == len(x) - 1 and axis > 0:
        shape[-1] = out[1]
    return {0: shape}


def _conv(node, inputs, outputs):
    """The batch; the image size where the stride is 1 (MXNet's rule: out = in + 2 pad -
    dilated kernel + 1)."""
    out, w = outputs[0], inputs[1] if len(inputs) > 1 else None
    if out is None or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return {}
    spatial = len(out) - 2
    kernel = node.attrs.get("kernel_shape") or (w[2:] if w is not None else [None] * spatial)
    strides = node.attrs.get("strides") or [1] * spatial
    dilations = node.attrs.get("dilations") or [1] * spatial
    pads = node.attrs.get("pads") or [0] * 2 * spatial
    shape = [out[0], None]
    for i in range(spatial):
        size, k = out[2 + i], kernel[i]
        exact = strides[i] == 1 and isinstance(size, int) and isinstance(k, int)
        shape.append(size + dilations[i] * (k - 1) - pads[i] - pads[spatial + i]
                     if exact else None)
    return {0: shape}


def _pool(node, inputs, outputs):
    out, x = outputs[0], inputs[0]
    if out is None or x is None or len(x) != len(out):
        return {}
    return {0: [out[0], out[1]] + [None] * (len(x) - 2)}


def _concat(node, inputs, outputs):
    out = outputs[0]
    if out is None:
        return {}
    axis = node.attrs.get("axis", 1) % len(out)
    found = {}
    for index, shape in enumerate(inputs):
        others = [s[axis] if s is not None else None
                  for i, s in enumerate(inputs) if i != index]
        along = None
        if isinstance(out[axis], int) and all(isinstance(d, int) for d in others):
            along = out[axis] - sum(others)
        found[index] = out[:axis] + (along,) + out[axis + 1:]
    return found


def _split(node, inputs, outputs):
    if any(o is None for o in outputs) or len({len(o) for o in outputs}) != 1:
        return {}
    axis = node.attrs.get("axis", 0) % len(outputs[0])
    parts = [o[axis] for o in outputs]
    along = sum(parts) if all(isinstance(p, int) for p in parts) else None
    return {0: outputs[0][:axis] + (along,) + outputs[0][axis + 1:]}


def _constant_axes(node):
    entry = node.inputs[1] if len(node.inputs) > 1 else None
    if entry is None or not entry[0].is_constant:
        return node.attrs.get("axes")
    return [int(a) for a in entry[0].info["value"].reshape(-1)]


def _squeeze(node, inputs, outputs):
    out, axes = outputs[0], _constant_axes(node)
    if out is None or axes is None:
        return {}
    rank = len(out) + len(axes)
    axes = {a % rank for a in axes}
    dims = iter(out)
    return {0: [1 if i in axes else next(dims) for i in range(rank)]}


def _unsqueeze(node, inputs, outputs):
    out, axes = outputs[0], _constant_axes(node)
    if out is None or axes is None:
        return {}
    axes = {a % len(out) for a in axes}
    return {0: [d for i, d in enumerate(out) if i not in axes]}


def _transpose(node, inputs, outputs):
    out = outputs[0]
    if out is None:
        return {}
    perm = node.attrs.get("perm") or list(reversed(range(len(out))))
    shape = [None] * len(out)
    for i, axis in enumerate(perm):
        shape[axis] = out[i]
    return {0: shape}


_RULES = {"Gemm": _gemm, "Flatten": _flatten, "Conv": _conv, "MaxPool": _pool,
          "AveragePool": _pool, "LpPool": _pool, "Concat": _concat, "Split": _split,
          "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Transpose": _transpose}
