"""The losses MXNet's output layers train with: a Loss whose gradient is the layer's backward
(SoftmaxOutput's ``softmax - one_hot(label)``, the regressions' residuals) divided by the
batch size, as MXNet's Module applies it (``rescale_grad = 1 / batch size``).
:class:`mixrt.module.SymbolModule` trains a symbol's output layer with them.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.training.program import LOSS_OPSET, Loss, bce_with_logits, l1, mse


def output_layer_loss(kind: str, options: dict, logits: str, label: str) -> Loss:
    """The Loss whose gradient is MXNet's output layer ``kind``'s backward divided by the
    batch size (what MXNet's Module applies: rescale_grad = 1 / batch size)."""
    scale = float(options.get("grad_scale", 1.0))
    if kind == "SoftmaxOutput":
        return _softmax_output_loss(logits, label, options, scale)
    regressions = {"LinearRegressionOutput": (mse, 0.5),
                   "LogisticRegressionOutput": (bce_with_logits, 1.0),
                   "MAERegressionOutput": (l1, 1.0)}
    if kind not in regressions:
        raise InputError(f"no loss is known for output layer {kind!r}; known: "
                         f"{['SoftmaxOutput', *regressions]}")
    make, factor = regressions[kind]
    return _regression_loss(kind, make, logits, label, factor * scale)


def _regression_loss(kind: str, make, logits: str, label: str, factor: float) -> Loss:
    """``make``'s mean loss times ``factor``, the label reshaped to the logits' shape (a
    (batch,) label for one output per sample must not broadcast to (batch, batch))."""
    def build(graph, names, dtype):
        shaped = names("label_shaped")
        _loss_node(graph, "Reshape", [label, _loss_node(graph, "Shape", [logits],
                                                          names("logits_shape"))], shaped)
        value = make(logits, shaped).build(graph, names, dtype)
        return _scaled(graph, names, value, factor, dtype)
    return Loss(f"{kind}*{factor!r}", logits, label, "float", build)


def _softmax_output_loss(logits: str, label: str, options: dict, scale: float) -> Loss:
    """MXNet's SoftmaxOutput gradient is (softmax - one_hot(label)) * grad_scale per
    sample, none for ignored ones, divided by the batch size ("batch") or by the count of
    labels not ignored ("valid"); Module's rescale divides by the batch size again."""
    normalization = options.get("normalization", "null")
    attributes = {"reduction": "mean" if normalization == "valid" else "sum"}
    if options.get("use_ignore"):
        attributes["ignore_index"] = int(options.get("ignore_label", -1))

    def build(graph, names, dtype):
        total = _loss_node(graph, "SoftmaxCrossEntropyLoss", [logits, label], names("ce"),
                           **attributes)
        batch = _loss_node(graph, "ReduceProd", [_loss_node(
            graph, "Shape", [logits], names("batch_dims"), start=0, end=1)],
            names("batch_size"), keepdims=0)
        size = _loss_node(graph, "CastLike", [batch, total], names("batch_size_float"))
        if normalization == "batch":
            size = _loss_node(graph, "Mul", [size, size], names("batch_size_squared"))
        mean = _loss_node(graph, "Div", [total, size], names("ce_per_batch"))
        return _scaled(graph, names, mean, scale, dtype)
    kind = f"SoftmaxOutput:{normalization}:{attributes.get('ignore_index')}*{scale!r}"
    return Loss(kind, logits, label, "int64", build)


def _scaled(graph: Graph, names, value: str, factor: float, dtype) -> str:
    if factor == 1.0:
        return value
    constant = names("loss_factor")
    graph.initializers[constant] = np.asarray(factor, dtype=dtype)
    return _loss_node(graph, "Mul", [value, constant], names("loss_scaled"))


def _loss_node(graph: Graph, op_type: str, inputs: list[str], output: str,
               **attributes) -> str:
    graph.nodes.append(Node(op_type, inputs, [output], name=output, opset=LOSS_OPSET,
                            attributes=attributes))
    return output
