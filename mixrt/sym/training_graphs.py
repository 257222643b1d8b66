"""A graph's training form and the differentiated forward/backward pair built from it.

    pair = TrainingPair(graph, wrt=["fc1_weight"], aux_names=["bn_moving_mean", ...],
                        options={"device": "cpu"})
    values = pair.forward.run_on_device(None, feeds_for(feeds, pair.forward))
    grads = pair.backward.run_on_device(None, feeds_for({**saved, **heads}, pair.backward))

``training_graph`` switches BatchNormalization to batch statistics (its updated running
statistics become outputs) and Dropout on; ``TrainingPair`` differentiates such a graph
(``runtime/passes/autodiff.py``) and cuts it where the forward ends, seeding each float
output with a head-gradient input (``HEAD_GRAD``) and each MXNet output layer
(SoftmaxOutput, the regression outputs) with its own loss.

It stands apart from the Executor (``mixrt.sym.executor``) because more than the Executor
builds on it: Gluon's hybridized blocks (``mixrt.gluon.hybrid``, ``mixrt.gluon.op_hooks``)
and the Graph fine-tuning Module (``mixrt.module.graph_module``) run the same pairs.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph, split_forward_backward
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import copy_graph
from mixrt.runtime.session import Session
from mixrt.runtime.training.program import LOSS_OPSET, NameMaker
from mixrt.output_losses import output_layer_loss
from mixrt.sym.symbol import LOSS_HEAD, Symbol
from mixrt.sym.symbol_layers import output_layer

TensorProto_INT64 = 7  # ONNX's element type code of int64 (Cast's ``to``)

HEAD_GRAD = "{}_head_grad"


class TrainingPair:
    """The training forward and the backward Session of one shape signature.
    ``train=False`` differentiates the graph as written (inference-form BatchNormalization
    and Dropout): what ``autograd.record(train_mode=False)`` asks of a hybridized block.

    ``output_layers`` ({output index: OutputLayer}) are MXNet output layers among the
    outputs: their backward is their loss gradient, whatever the head gradient (MXNet's
    SoftmaxOutput gives ``softmax - one_hot(label)``). Each gets its loss attached
    (``mixrt.output_losses``: a mean over the batch), seeded with the batch size."""

    def __init__(self, graph: Graph, wrt: list[str], aux_names: list[str], options: dict,
                 train: bool = True, output_layers: dict | None = None,
                 read_as: dict | None = None):
        # read_as: {value: the value an output layer's loss reads in its place}
        train, self.aux_updates = training_graph(graph, aux_names) if train else \
            (copy_graph(graph), {})
        self.model_outputs = graph.output_names
        self.wrt = list(wrt)
        types = _output_types(train)
        layers = output_layers or {}
        self.seeded = [(i, name) for i, name in enumerate(self.model_outputs)
                       if _is_float(types.get(name)) and i not in layers]
        seeds = {name: HEAD_GRAD.format(name) for _, name in self.seeded}
        self._loss_batches = {}  # loss seed input -> (batch size, dtype)
        for index, layer in layers.items():
            loss, batch, dtype = _attach_layer_loss(train, layer, f"output{index}",
                                                    read_as or {})
            seeds[loss] = HEAD_GRAD.format(loss)
            train.inputs.append(Value(seeds[loss], TensorType(dtype, ())))
            self._loss_batches[seeds[loss]] = (batch, dtype)
        if not self.wrt or not seeds:
            self.forward, self.backward, self.saved = Session(train, **options), None, []
            return
        for _, name in self.seeded:
            train.inputs.append(Value(HEAD_GRAD.format(name), types.get(name)))
        joint = gradient_graph(train, next(iter(seeds)), self.wrt, seeds=seeds)
        split = split_forward_backward(joint)
        self.saved = split.saved
        self.forward = Session(split.forward, **options)
        self.backward = Session(split.backward, **options)
        grad_order = {joint.grads[w]: w for w in self.wrt}
        self.wrt = [grad_order[name] for name in split.backward.output_names]

    def loss_seeds(self) -> dict:
        """{loss seed input: (batch size, dtype)}: an output layer's loss is a mean over the
        batch, MXNet's gradient its sum."""
        return dict(self._loss_batches)


def loss_head_indices(symbol: Symbol) -> set[int]:
    """The indices of the outputs that are loss heads (``LOSS_HEAD``)."""
    return {index for index, (node, _) in enumerate(symbol._outputs)
            if node.info.get(LOSS_HEAD)}


def output_layers(symbol: Symbol) -> dict:
    """{output index: OutputLayer} for the outputs of ``symbol`` that are MXNet output
    layers (SoftmaxOutput, LinearRegressionOutput, ...)."""
    found = {}
    for index, entry in enumerate(symbol._outputs):
        layer = output_layer(Symbol([entry]))
        if layer is not None and layer.label is not None:
            found[index] = layer
    return found


def _attach_layer_loss(graph: Graph, layer, tag: str,
                       read_as: dict) -> tuple[str, int, np.dtype]:
    """Add ``layer``'s loss to ``graph`` (SoftmaxOutput's class labels cast to int64 first,
    as MXNet's float labels hold class indices); returns the loss value,
    the batch size and the loss's dtype."""
    logits = layer.logits.list_outputs()[0]
    logits = read_as.get(logits, logits)
    label = layer.label
    if layer.kind == "SoftmaxOutput":
        label = f"{tag}_{layer.label}_class"
        graph.nodes.append(Node("Cast", [layer.label], [label], name=label, opset=LOSS_OPSET,
                                attributes={"to": TensorProto_INT64}))
    else:  # MXNet's output layers pass their labels no gradient
        label = f"{tag}_{layer.label}_held"
        graph.nodes.append(Node("BlockGrad", [layer.label], [label], name=label,
                                domain="mixrt", opset=1))
    loss = output_layer_loss(layer.kind, layer.options, logits, label)
    logits_type = infer_types(graph).get(logits)
    shape = getattr(logits_type, "shape", None)
    if not shape or not isinstance(shape[0], int):
        raise GradientError(f"the batch size of output layer input {logits!r} is not known "
                            f"at the bound shapes ({logits_type})")
    dtype = np.dtype(getattr(logits_type, "dtype", None) or np.float32)
    value = loss.build(graph, NameMaker(graph), dtype)
    graph.outputs = graph.outputs + [Value(value)]
    return value, shape[0], dtype


def training_graph(graph: Graph, aux_names: list[str]) -> tuple[Graph, dict[str, str]]:
    """A copy of ``graph`` in training form, and {auxiliary state: output holding its new
    value}: BatchNormalization computes batch statistics and outputs the updated running
    ones; Dropout is switched on."""
    train = copy_graph(graph)
    aux = set(aux_names)
    updates: dict[str, str] = {}
    for node in train.nodes:
        if node.op_type == "BatchNormalization" and not node.domain:
            updates.update(_batch_norm_in_training(train, node, aux))
        elif node.op_type == "Dropout" and not node.domain and node.opset >= 12:
            _dropout_in_training(train, node)
    train.outputs = train.outputs + [Value(name) for name in updates.values()]
    return train, updates


def _batch_norm_in_training(graph: Graph, node: Node, aux: set) -> dict[str, str]:
    node.attributes["training_mode"] = 1
    while len(node.outputs) < 3:
        node.outputs.append("")
    updates = {}
    for position, input_index in ((1, 3), (2, 4)):
        state = node.inputs[input_index]
        if state not in aux:
            continue
        if not node.outputs[position]:
            node.outputs[position] = f"{node.name}_{state}_update"
        updates[state] = node.outputs[position]
    return updates


def _dropout_in_training(graph: Graph, node: Node) -> None:
    while len(node.inputs) < 3:
        node.inputs.append("")
    if not node.inputs[2]:
        flag = f"{node.name}_training_mode"
        graph.initializers[flag] = np.array(True)
        node.inputs[2] = flag


def _output_types(graph: Graph) -> dict:
    return infer_types(graph)


def _is_float(value_type) -> bool:
    return isinstance(value_type, TensorType) and value_type.dtype is not None and \
        np.dtype(value_type.dtype).kind == "f"


def feeds_for(feeds: dict, session: Session) -> dict:
    """The entries of ``feeds`` that ``session`` takes (its inputs that are not
    initializers)."""
    wanted = {v.name for v in session.graph.feed_inputs()}
    return {k: v for k, v in feeds.items() if k in wanted}

