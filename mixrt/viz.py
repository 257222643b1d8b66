"""Look at a Symbol: a Graphviz drawing and a layer table (MXNet's ``mx.viz``).

    from mixrt import viz
    from mixrt.models.lenet import lenet
    dot = viz.plot_network(lenet(), shape={"data": (1, 1, 28, 28)})
    dot.source                                  # the dot text; no Graphviz program needed
    viz.render(dot, "lenet.svg")                # needs Graphviz's `dot` on PATH
    viz.print_summary(lenet(), shape={"data": (1, 1, 28, 28)})

Nodes are the operators, labelled with their type, key attributes and name, and colored by
family; variables are input nodes. Parameters — variables with an initializer, auxiliary
states, and names ending as MXNet's parameters do (``_weight``, ``_bias``, ``_gamma``,
``_moving_mean``, ...) — and constants are hidden unless ``hide_weights=False``. Given
input shapes, edges carry the shapes inference finds.

The drawing is a graphviz package object, and that package is an extra (``mixrt[plot]``):
it is imported when a drawing is made, and its absence is an error naming the extra then,
so that ``print_summary`` and ``from mixrt import viz`` work without it.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from mixrt.base.errors import InputError, missing_dependency
from mixrt.sym.symbol import LAYER, Symbol, SymNode

if TYPE_CHECKING:
    import graphviz

PARAMETER_SUFFIXES = ("_weight", "_bias", "_gamma", "_beta", "_moving_mean", "_moving_var",
                      "_running_mean", "_running_var")

# the attributes worth reading in a node's label, per op
KEY_ATTRIBUTES = {
    "Conv": ("kernel_shape", "strides", "pads", "dilations", "group"),
    "ConvTranspose": ("kernel_shape", "strides", "pads", "dilations", "group"),
    "MaxPool": ("kernel_shape", "strides", "pads"),
    "AveragePool": ("kernel_shape", "strides", "pads"),
    "LpPool": ("kernel_shape", "strides", "pads"),
    "Gemm": ("transA", "transB"),
    "Flatten": ("axis",), "Concat": ("axis",), "Softmax": ("axis",),
    "LogSoftmax": ("axis",), "Transpose": ("perm",), "LeakyRelu": ("alpha",),
    "Dropout": ("ratio",),
}

# ColorBrewer's Set3 and a grey, one per op family; ops not listed are "other"
COLORS = {"input": "#8dd3c7", "linear": "#fb8072", "normalization": "#bebada",
          "activation": "#ffffb3", "pooling": "#80b1d3", "shape": "#fdb462",
          "arithmetic": "#b3de69", "loss": "#fccde5", "other": "#d9d9d9"}
FAMILIES = {
    "linear": ("Conv", "ConvTranspose", "Gemm", "MatMul", "ConvInteger", "QLinearConv",
               "QLinearMatMul", "MatMulInteger", "Einsum"),
    "normalization": ("BatchNormalization", "LayerNormalization", "InstanceNormalization",
                      "GroupNormalization", "LRN", "LpNormalization"),
    "activation": ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "PRelu", "Elu", "Selu", "Gelu",
                   "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "Celu",
                   "ThresholdedRelu", "Softmax", "LogSoftmax", "Dropout", "Clip"),
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
                "GlobalLpPool", "MaxRoiPool", "RoiAlign"),
    "shape": ("Reshape", "Flatten", "Transpose", "Concat", "Split", "Squeeze", "Unsqueeze",
              "Slice", "Gather", "Expand", "Tile", "Pad", "Shape", "Identity", "Cast",
              "CastLike"),
    "arithmetic": ("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Abs", "Exp", "Log",
                   "Sum", "Mean", "Max", "Min", "ReduceMean", "ReduceSum", "ReduceMax"),
    "loss": ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"),
}
_FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}

NODE_ATTRS = {"shape": "box", "style": "rounded,filled", "fontname": "Helvetica",
              "fontsize": "10", "penwidth": "0.8"}
EDGE_ATTRS = {"fontname": "Helvetica", "fontsize": "9", "arrowsize": "0.7"}


def plot_network(symbol: Symbol, title: str = "plot", save_format: str = "pdf",
                 shape: dict | None = None, dtype: dict | None = None,
                 node_attrs: dict | None = None, hide_weights: bool = True) -> graphviz.Digraph:
    """The symbol as a ``graphviz.Digraph`` (``.source`` is its dot text). ``shape`` (and
    ``dtype``): the inputs' shapes (dtypes) by name, to label edges with what flows along
    them; ``node_attrs`` override the default node attributes; ``save_format`` is the
    Digraph's format for its own ``.render``."""
    _check_symbol(symbol, "plot_network")
    graphviz = _graphviz("plot_network")
    if save_format not in graphviz.FORMATS:
        raise InputError(f"plot_network: save_format {save_format!r} is not a Graphviz "
                         f"format; common ones are ['pdf', 'png', 'svg'] (all: "
                         f"graphviz.FORMATS)")
    _warn_repeated_names(symbol)
    distinct = symbol._distinct()  # nodes sharing a name: each its own node and edges
    shown = {id(copy): node.name for copy, node in
             zip(distinct._topological(), symbol._topological())}
    symbol = distinct
    shapes = _internal_shapes(symbol, shape) if shape else {}
    dtypes = _internal_dtypes(symbol, dtype) if dtype else {}
    dot = graphviz.Digraph(name=title, format=save_format,
                           node_attr={**NODE_ATTRS, **(node_attrs or {})},
                           edge_attr=EDGE_ATTRS)
    ids: dict[int, str] = {}
    for node in symbol._topological():
        if hide_weights and is_parameter(node):
            continue
        # ids are ours, never names: a name may hold quotes, spaces or dot's port colons
        ids[id(node)] = node_id = f"node{len(ids)}"
        family = "input" if node.op in (None, "") else _FAMILY_OF.get(node.op, "other")
        dot.node(node_id, label=graphviz.nohtml(_label(graphviz, node, shown.get(id(node)))),
                 fillcolor=COLORS[family],
                 **({"shape": "oval"} if node.op is None else {}))
        for entry in node.inputs:
            if entry is None or id(entry[0]) not in ids:
                continue
            value = entry[0].output_name(entry[1])
            edge_label = " ".join(filter(None, (_shape_text(shapes.get(value)),
                                                dtypes.get(value))))
            dot.edge(ids[id(entry[0])], node_id,
                     **({"label": edge_label} if edge_label else {}))
    return dot


def render(digraph: graphviz.Digraph, path, format: str | None = None) -> str:
    """Draw ``digraph`` into the file ``path`` (format: ``format``, else the path's suffix,
    else the digraph's); returns the path. Needs Graphviz's ``dot`` program."""
    graphviz = _graphviz("render")
    path = Path(path)
    format = format or path.suffix.lstrip(".") or digraph.format
    if format not in graphviz.FORMATS:
        raise InputError(f"viz.render: {format!r} is not a Graphviz format; common ones are "
                         f"['pdf', 'png', 'svg'] (all: graphviz.FORMATS)")
    missing = ("viz.render: drawing needs Graphviz's `dot` program, which is not on PATH; "
               "install Graphviz (apt install graphviz, brew install graphviz, conda "
               "install graphviz) or use the digraph's .source")
    if shutil.which("dot") is None:
        raise InputError(missing)
    try:
        data = digraph.pipe(format=format)
    except graphviz.ExecutableNotFound:
        raise InputError(missing) from None
    path.write_bytes(data)
    return str(path)


def print_summary(symbol: Symbol, shape: dict | None = None, line_length: int = 120) -> str:
    """A table of the layers (operators and input variables): output shape, parameter count
    and the layers feeding each, then the totals. Printed and returned. Parameters are
    counted once, at their first consumer; auxiliary states (running statistics) count as
    non-trainable."""
    _check_symbol(symbol, "print_summary")
    symbol = symbol._distinct()  # a repeated name's later nodes listed as <name>_<k>
    shapes = _internal_shapes(symbol, shape or {})
    widths = [int(line_length * f) for f in (0.36, 0.24, 0.12)]
    widths.append(line_length - sum(widths))
    lines = ["=" * line_length,
             _row(("Layer (type)", "Output Shape", "Param #", "Previous Layer"), widths),
             "=" * line_length]
    counted: set[int] = set()
    trainable = frozen = 0
    unknown = []
    for node in symbol._topological():
        if is_parameter(node) or node.op == "":
            continue
        params = 0
        for parameter in _parameter_inputs(node, counted):
            size = _size(shapes.get(parameter.name))
            if size is None:
                unknown.append(parameter.name)
                continue
            params += size
            if parameter.info.get("aux"):
                frozen += size
            else:
                trainable += size
        outputs = [_shape_text(shapes.get(node.output_name(i))) or "?"
                   for i in range(node.num_outputs)]
        previous = [e[0].name for e in node.inputs
                    if e is not None and not is_parameter(e[0]) and e[0].op != ""]
        kind = "Variable" if node.op is None else node.op
        lines.append(_row((f"{node.name} ({kind})", ", ".join(outputs), f"{params:,}",
                           previous[0] if previous else ""), widths))
        lines += [_row(("", "", "", name), widths) for name in previous[1:]]
        lines.append("_" * line_length)
    lines[-1] = "=" * line_length
    lines += [f"Total params: {trainable + frozen:,}", f"Trainable params: {trainable:,}",
              f"Non-trainable params: {frozen:,}"]
    if unknown:
        lines.append(f"Not counted (shape unknown; pass shape=): {', '.join(unknown)}")
    lines.append("_" * line_length)
    text = "\n".join(lines)
    print(text)
    return text


def is_parameter(node: SymNode) -> bool:
    """A variable the model learns or updates rather than a data input, or a constant."""
    if node.op == "":
        return True
    if node.op is not None:
        return False
    return (bool(node.info.get("aux")) or "init" in node.info
            or node.name.endswith(PARAMETER_SUFFIXES))


# -- helpers -----------------------------------------------------------------------------------

def _graphviz(what: str):
    try:
        import graphviz  # noqa: PLC0415  (the plot extra: only when a drawing is made)
    except ImportError as exc:
        raise missing_dependency(f"mixrt.viz.{what}", "graphviz", "plot") from exc
    return graphviz


def _check_symbol(symbol, what: str) -> None:
    if not isinstance(symbol, Symbol):
        raise InputError(f"{what} takes a mixrt.sym.Symbol, got {type(symbol).__name__}")


def _warn_repeated_names(symbol: Symbol) -> None:
    """MXNet's warning for nodes that share a name (its drawing joins them by name, which
    can make a cycle; here each stays its own node)."""
    seen, repeated = set(), []
    for node in symbol._topological():
        if node.info.get(LAYER, node.name) != node.name:
            continue  # a layer's inner node: MXNet's layer is one node, named once
        if node.name in seen and node.name not in repeated:
            repeated.append(node.name)
        seen.add(node.name)
    if repeated:
        warnings.warn("There are multiple variables with the same name in your graph, "
                      f"which a drawing by name could join into a cycle. Repeated names: "
                      f"{','.join(repeated)}", RuntimeWarning, stacklevel=3)


def _label(graphviz, node: SymNode, name: str | None = None) -> str:
    name = name or node.name
    if node.op is None:
        return graphviz.escape(name)
    if node.op == "":
        return graphviz.escape(f"constant {name}")
    op = f"{node.domain}::{node.op}" if node.domain else node.op
    lines = [op]
    settings = [f"{key}={_attribute_text(key, node.attrs[key])}"
                for key in KEY_ATTRIBUTES.get(node.op, ()) if key in node.attrs]
    if settings:
        lines.append(", ".join(settings))
    lines.append(name)
    return "\\n".join(graphviz.escape(line) for line in lines)


def _attribute_text(key: str, value) -> str:
    if isinstance(value, (list, tuple)):
        separator = "x" if key in ("kernel_shape", "strides", "dilations") else ","
        return separator.join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _internal_shapes(symbol: Symbol, given: dict) -> dict:
    internals = symbol.get_internals()
    return dict(zip(internals.list_outputs(), internals._known_shapes((), given)[1]))


def _internal_dtypes(symbol: Symbol, given: dict) -> dict:
    internals = symbol.get_internals()
    found = internals.infer_type(**given)[1]
    return {name: None if dtype is None else str(getattr(dtype, "name", dtype))
            for name, dtype in zip(internals.list_outputs(), found)}


def _shape_text(shape) -> str:
    if shape is None:
        return ""
    return "x".join("?" if d is None or not isinstance(d, int) else str(d) for d in shape) \
        or "scalar"


def _size(shape) -> int | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    size = 1
    for d in shape:
        size *= d
    return size


def _parameter_inputs(node: SymNode, counted: set[int]) -> list[SymNode]:
    found = []
    for entry in node.inputs:
        if entry is None or not is_parameter(entry[0]) or entry[0].op == "":
            continue
        if id(entry[0]) not in counted:
            counted.add(id(entry[0]))
            found.append(entry[0])
    return found


def _row(cells, widths) -> str:
    cells = [cell if len(cell) < width else cell[:width - 4] + "..."
             for cell, width in zip(cells, widths)]
    return "".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()


__all__ = ["plot_network", "print_summary", "render", "is_parameter"]
