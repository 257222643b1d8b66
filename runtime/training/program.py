"""Training programs: a forward graph, a loss and the trainable parameters, compiled once into
one joint forward+backward graph that a Session runs over a single planned arena.

    program = TrainingProgram(graph, loss=softmax_cross_entropy("logits", "label"),
                              trainable=["fc.weight", "fc.bias"])
    loss, grads = program.step(params, {"data": x, "label": y})

The loss is appended to the graph as ordinary ONNX nodes (so it differentiates like any other
op), trainable initializers become graph inputs (fed from ``params`` each step, never folded
into constants) and frozen ones stay constants that the optimizer passes may fold.

``precision="float16"`` rewrites the model to compute in float16 before the loss is attached
(``mixed_precision.lower_precision``) and multiplies the loss by a fed scale before it is
differentiated (``mixed_precision.scale_loss``); ``step`` unscales the gradients, which are
float32 like the parameters, and returns None for them when they overflowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mixrt.base.errors import GradientError, InputError
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import array_module, to_host
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.memory_report import plan_report
from mixrt.runtime.training.mixed_precision import (FLOAT32, LossScaler, lower_precision,
                                                    parse_precision, scale_loss)
from mixrt.runtime.passes.autodiff import gradient_graph
from mixrt.runtime.passes.rewrite import NameMaker, copy_graph
from mixrt.runtime.session import Session
from mixrt.runtime.passes.infer import infer_types

LOSS_OPSET = 17


# -- losses: functions that append loss nodes to a graph and name the label input ---------------

@dataclass(frozen=True)
class Loss:
    """How to attach a loss: ``build(graph, names, dtype) -> loss value name`` (``dtype``:
    the prediction's float type); ``label`` is the graph input the labels are fed through,
    ``label_dtype`` its dtype ("float": the prediction's)."""

    kind: str
    prediction: str
    label: str
    label_dtype: str
    build: Callable[[Graph, NameMaker, np.dtype], str]


def softmax_cross_entropy(prediction: str, label: str = "label") -> Loss:
    """Mean cross-entropy of class scores (N, C) against int64 class labels (N,)."""
    def build(graph, names, dtype):
        loss = names("loss")
        _node(graph, "SoftmaxCrossEntropyLoss", [prediction, label], [loss],
              reduction="mean")
        return loss
    return Loss("softmax_cross_entropy", prediction, label, "int64", build)


def mse(prediction: str, label: str = "label") -> Loss:
    """Mean squared error against float targets shaped like the prediction."""
    def build(graph, names, dtype):
        diff, sq, loss = names("diff"), names("sq"), names("loss")
        _node(graph, "Sub", [prediction, label], [diff])
        _node(graph, "Mul", [diff, diff], [sq])
        _node(graph, "ReduceMean", [sq], [loss], keepdims=0)
        return loss
    return Loss("mse", prediction, label, "float", build)


def l1(prediction: str, label: str = "label") -> Loss:
    """Mean absolute error against float targets shaped like the prediction."""
    def build(graph, names, dtype):
        diff, absolute, loss = names("diff"), names("abs"), names("loss")
        _node(graph, "Sub", [prediction, label], [diff])
        _node(graph, "Abs", [diff], [absolute])
        _node(graph, "ReduceMean", [absolute], [loss], keepdims=0)
        return loss
    return Loss("l1", prediction, label, "float", build)


def bce_with_logits(prediction: str, label: str = "label") -> Loss:
    """Mean binary cross-entropy of logits x against targets y in [0, 1], in the form that
    never overflows: max(x, 0) - x y + log(1 + exp(-|x|))."""
    def build(graph, names, dtype):
        pos, xy, absolute, neg, exp, one, log1p = (names(n) for n in (
            "relu", "xy", "abs", "negabs", "exp", "one", "log1p"))
        margin, term, loss = names("margin"), names("term"), names("loss")
        graph.initializers[one] = np.ones((), dtype=dtype)
        _node(graph, "Relu", [prediction], [pos])
        _node(graph, "Mul", [prediction, label], [xy])
        _node(graph, "Abs", [prediction], [absolute])
        _node(graph, "Neg", [absolute], [neg])
        _node(graph, "Exp", [neg], [exp])
        _node(graph, "Add", [one, exp], [log1p + "_in"])
        _node(graph, "Log", [log1p + "_in"], [log1p])
        _node(graph, "Sub", [pos, xy], [margin])
        _node(graph, "Add", [margin, log1p], [term])
        _node(graph, "ReduceMean", [term], [loss], keepdims=0)
        return loss
    return Loss("bce_with_logits", prediction, label, "float", build)


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy, "mse": mse, "l1": l1,
          "bce_with_logits": bce_with_logits}


def _node(graph: Graph, op_type: str, inputs: list[str], outputs: list[str], **attributes):
    graph.nodes.append(Node(op_type, inputs, outputs, name=outputs[0], opset=LOSS_OPSET,
                            attributes=attributes))


def attach_loss(graph: Graph, loss: Loss) -> tuple[Graph, str, np.dtype]:
    """A copy of ``graph`` with the loss nodes and the label input added; returns it, the
    loss value's name and the dtype labels are fed in."""
    joint = copy_graph(graph)
    names = NameMaker(joint)
    prediction_type = joint.type_of(loss.prediction)
    if loss.prediction not in {o for n in joint.nodes for o in n.outputs} | set(
            joint.input_names):
        raise GradientError(f"loss {loss.kind!r}: the prediction {loss.prediction!r} is not a "
                            f"value of graph {joint.name!r}; its outputs are "
                            f"{joint.output_names}")
    float_dtype = _float_dtype(joint, loss.prediction, prediction_type)
    label_dtype = float_dtype if loss.label_dtype == "float" else np.dtype(loss.label_dtype)
    if loss.label not in joint.input_names:
        joint.inputs.append(Value(loss.label, TensorType(label_dtype, None)))
    return joint, loss.build(joint, names, float_dtype), label_dtype


def _float_dtype(graph: Graph, name: str, known) -> np.dtype:
    if isinstance(known, TensorType) and known.dtype is not None:
        return np.dtype(known.dtype)
    found = infer_types(graph).get(name)
    if isinstance(found, TensorType) and found.dtype is not None:
        return np.dtype(found.dtype)
    return np.dtype(np.float32)


# -- the program -----------------------------------------------------------------------------------

class TrainingProgram:
    """One compiled training step: feeds + current parameters -> loss, outputs, gradients.

    ``precision`` ("float32", "float16", or "bfloat16" on the CPU only: CuPy has no such
    type) is what the forward and backward graph computes in; parameters, gradients
    and outputs stay float32 (see :mod:`mixrt.runtime.training.mixed_precision`). float16 scales
    the loss with ``loss_scaler`` (default: a dynamic :class:`LossScaler`; ``False``:
    none); ``program.scaler`` may be swapped for another LossScaler between steps, not for
    None.

    ``cuda_graph=True`` (GPU) records each batch shape's forward and backward as one CUDA
    graph on its second step and replays it from then on (``runtime/cuda_graph.py``). The
    graph reads the parameters where they are (the optimizer updates them in place), and
    the gradients it hands back are its own buffers, valid until the next step: the caller
    runs the optimizer before stepping again, from one thread.

    ``state`` names (the feeds, the outputs) of what a step updates besides the weights
    (BatchNormalization's running statistics): the outputs come back as arrays of the
    session's device, for the caller to write into the fed arrays in place before the next
    step."""

    def __init__(self, graph: Graph, loss: Loss, trainable: list[str], *,
                 device: str = "cpu", opt_level: int = 1, strategy: str = "greedy",
                 mirror: frozenset | None = None, precision: str = "float32",
                 loss_scaler: LossScaler | bool | None = None, cuda_graph: bool = False,
                 state: tuple = ((), ())):
        self.loss_spec = loss
        self.trainable = list(trainable)
        self.precision = precision
        compute_dtype = parse_precision(precision, device)
        self.scaler = _default_scaler(compute_dtype, loss_scaler)
        with_loss, self.loss, self.label_dtype = attach_loss(
            _in_precision(graph, compute_dtype, loss.prediction), loss)
        differentiated, self._scale_input = self.loss, None
        if self.scaler is not None:
            with_loss, differentiated, self._scale_input = scale_loss(with_loss, self.loss)
        self.joint = gradient_graph(with_loss, differentiated, self.trainable,
                                    keep_outputs=True, mirror=mirror)
        self.session = Session(self.joint.graph, device=device, opt_level=opt_level,
                               strategy=strategy, cuda_graph=cuda_graph)
        # ``state``: (the feeds, the outputs) of what a step updates besides the weights
        # (running statistics): read in place, and handed back on the device
        state_feeds, self._state_outputs = (frozenset(names) for names in state)
        self.session.read_in_place([*self.trainable, *state_feeds])
        self._lent = cuda_graph  # the gradients without a copy each (see above)
        self.outputs = graph.output_names
        self._grad_names = [self.joint.grads[name] for name in self.trainable]

    def step(self, params: dict, feeds: dict) -> tuple[float, list, dict | None]:
        """Run forward and backward: (loss, the model's outputs, {param: gradient}). The
        outputs are host arrays; the gradients are arrays of the session's device.

        With a loss scaler the gradients come back unscaled, and as None when one of them
        overflowed: that step must be skipped (the scaler has already backed off)."""
        with self.session.device.active():  # the label cast and the unscaling run there
            return self._step(params, feeds)

    def _step(self, params: dict, feeds: dict) -> tuple[float, list, dict | None]:
        feeds = self._feeds(params, feeds)
        # gradients stay where the parameters are (the optimizer runs there); the loss and
        # the outputs (a batch of predictions, for metrics) come to the host
        values = self.session.run_on_device([self.loss, *self.outputs, *self._grad_names],
                                            feeds, lent=self._lent)
        loss, rest = to_host(values[0]), values[1:]
        outputs = [value if name in self._state_outputs else to_host(value)
                   for name, value in zip(self.outputs, rest)]
        grads = dict(zip(self.trainable, rest[len(self.outputs):]))
        if self.scaler is not None:
            finite = self.scaler.unscale(grads)
            self.scaler.update(finite)
            grads = grads if finite else None
        return float(loss), outputs, grads

    def _feeds(self, params: dict, feeds: dict) -> dict:
        feeds = dict(feeds)
        label = feeds.get(self.loss_spec.label)
        if label is not None:  # labels arrive as whatever the dataset holds
            xp = array_module(label)
            feeds[self.loss_spec.label] = xp.asarray(label).astype(self.label_dtype,
                                                                   copy=False)
        if self.scaler is not None:
            feeds[self._scale_input] = np.asarray(self.scaler.scale, np.float32)
        return {**feeds, **{n: params[n] for n in self.trainable}}

    def memory_report(self, params: dict, feeds: dict) -> dict:
        """The joint forward+backward plan for these shapes: arena, naive and lower bound."""
        return plan_report(self.session.memory_plan(self._feeds(params, feeds)))


def _in_precision(graph: Graph, dtype: np.dtype, prediction: str) -> Graph:
    """The model computing in ``dtype``; the prediction stays float32 so the loss nodes
    attached to it compute in float32."""
    if dtype == FLOAT32:
        return graph
    return lower_precision(graph, dtype, keep=(prediction,))


def _default_scaler(dtype: np.dtype, loss_scaler) -> LossScaler | None:
    """float16 scales by default (small gradients underflow it otherwise); bfloat16 has
    float32's range and float32 needs nothing, so they scale only with a scaler passed."""
    if loss_scaler is None:
        return LossScaler() if dtype == np.float16 else None
    if loss_scaler is False:
        return None
    if not isinstance(loss_scaler, LossScaler):
        raise InputError(f"loss_scaler must be a LossScaler, False or None, got "
                         f"{loss_scaler!r}")
    return loss_scaler
