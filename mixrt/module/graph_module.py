"""Module: fine-tune a graph (imported from ONNX or built in mixrt) with MXNet's ``fit`` shape.

    model = Module.from_onnx("digits.onnx")
    model.freeze(except_=["fc2.weight", "fc2.bias"])      # or model.replace_head(...)
    history = model.fit(train_iter, eval_data=test_iter, optimizer="sgd",
                        optimizer_params={"learning_rate": 0.1, "momentum": 0.9}, epochs=5,
                        checkpoint="run/ckpt")
    model.export_onnx("tuned.onnx")

    model = Module.from_symbol(net, data_names=["data"], label_names=["softmax_label"])
    model.fit(train_iter, optimizer_params={"learning_rate": 0.1}, epochs=5)   # MXNet's way

The model's float initializers are its parameters (``model.params``, a ParameterDict). A
training step is one :class:`~mixrt.runtime.training.TrainingProgram` run (forward and
backward in one planned arena), then ``Trainer.step`` applies the optimizer. Checkpoints are
``.npz`` files (parameters, optimizer state and a JSON record of the epoch and the data
iterator's shuffle state), loaded with ``allow_pickle=False``; resuming from one continues the
run exactly as if it had not stopped.

``fit(..., precision="float16")`` trains in mixed precision (PyTorch AMP / MXNet AMP): the
parameters, their gradients and the optimizer state stay float32, the forward and backward
graph computes in float16 and a dynamic :class:`~mixrt.runtime.training.mixed_precision.LossScaler`
(``model.loss_scaler``, saved in checkpoints) skips the steps whose gradients overflow.

This module holds the model: a graph and its parameters, what trains (``freeze``,
``replace_head``), the graph with the current values (``to_graph``, export); and
:class:`SymbolModule`, the Module over a Symbol that :meth:`Module.from_symbol` makes (so
it is defined here, beside the class that makes it). What the Module does with the graph
lives beside it, one module each: training (``graph_training.py``, a base: ``fit`` is what
the class is for), its checkpoints (``mixrt/checkpoints.py``, a base) and the running
statistics a training step carries (``graph_state.py``, a base that ``SymbolModule``
overrides in part), and inference (``graph_inference.py``), a part with a name of its own
(``_inference``) that ``predict`` and ``score`` hand to.
"""

from __future__ import annotations

import numpy as np

from mixrt import random as mixrt_random
from mixrt.checkpoints import Checkpoints
from mixrt.base.errors import InputError, ShapeError
from mixrt.exporters.onnx import save_model
from mixrt.gluon import Parameter, ParameterDict, Trainer
from mixrt.initializer import create as create_initializer, starting_value, Uniform
from mixrt.io import DataIter
from mixrt.module import module as mxnet_module
from mixrt.module.checks import static_type, symbol_names
from mixrt.module.graph_inference import GraphInference
from mixrt.module.graph_state import running_statistics, RunningState, statistics_updates
from mixrt.module.graph_training import GraphTraining
from mixrt.ops.device import array_module, parse_device, to_host
from mixrt.ops.ir.types import TensorType
from mixrt.output_losses import output_layer_loss
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.training.mixed_precision import LossScaler
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import copy_graph, eliminate_dead_nodes
from mixrt.runtime.session import load_graph, Session
from mixrt.runtime.training.program import Loss, LOSSES, TrainingProgram
from mixrt.sym.executor import training_graph
from mixrt.sym.symbol_layers import output_layer
from mixrt.sym.symbol import Symbol


class Module(Checkpoints, GraphTraining, RunningState):
    """``device`` ("cpu", "gpu", "gpu:1" or a Context) is where the training and inference
    sessions run and where the parameters, their gradients and the optimizer's state live:
    a GPU step moves only the batch in and the loss and outputs out.

    ``Module(symbol, data_names, label_names, context=...)`` (a Symbol first, as MXNet's
    ``mx.mod.Module``) makes MXNet's Module instead (``mixrt/module/module.py``)."""

    def __new__(cls, graph=None, *args, **kwargs):
        if cls is Module and (isinstance(graph, Symbol) or "symbol" in kwargs):
            return mxnet_module.Module(graph, *args, **kwargs) if graph is not None \
                else mxnet_module.Module(*args, **kwargs)
        return super().__new__(cls)

    load = staticmethod(mxnet_module.Module.load)  # MXNet's Module.load(prefix, epoch)

    def __init__(self, graph: Graph, *, output: str | None = None, device: str = "cpu"):
        self.graph = copy_graph(graph)
        self.output = output or self.graph.output_names[0]
        self.device = device
        self.loss_scaler: LossScaler | None = None  # made by the first float16 step
        self.params = ParameterDict(
            (name, self._parameter(name, array))
            for name, array in self.graph.initializers.items()
            if np.asarray(array).dtype.kind == "f")
        # BatchNormalization's running statistics are state that training steps update
        # (MXNet's auxiliary states, PyTorch's buffers), never trained by the optimizer
        self._statistics = running_statistics(self.graph) & set(self.params)
        for name in self._statistics:
            self.params[name].grad_req = "null"
        self._state_updates: dict[str, str] = {}  # state -> the output with its new value
        self.data_names = [v.name for v in self.graph.feed_inputs()]
        self._programs: dict[tuple, TrainingProgram] = {}
        self._inference = GraphInference(self)  # predict, score and their session
        self._version = 0

    @classmethod
    def from_onnx(cls, source, *, output: str | None = None, device: str = "cpu") -> "Module":
        return cls(load_graph(source), output=output, device=device)

    @classmethod
    def from_symbol(cls, symbol, data_names=("data",), label_names=None, device: str = "cpu",
                    *, initializer=None) -> "SymbolModule":
        """MXNet's ``Module(symbol, data_names, label_names, context)``: see
        :class:`SymbolModule`. ``label_names`` defaults to the head layer's label."""
        return SymbolModule(symbol, data_names, label_names, device=device,
                            initializer=initializer)

    # -- choosing what trains --------------------------------------------------------------

    def freeze(self, names=None, *, except_=None) -> None:
        """Stop ``names`` (default: every parameter) from training, except ``except_``."""
        chosen = set(self.params if names is None else names)
        unknown = (chosen | set(except_ or ())) - set(self.params)
        if unknown:
            raise InputError(f"no parameters named {sorted(unknown)}; the model's parameters "
                             f"are {list(self.params)}")
        for name in chosen - set(except_ or ()):
            self.params[name].grad_req = "null"

    def _parameter(self, name: str, value) -> Parameter:
        param = Parameter(name, value)
        if parse_device(self.device).kind != "cpu":
            param.reset_ctx(self.device)
        return param

    def unfreeze(self, names=None) -> None:
        for name in (self.params if names is None else names):
            self.params[name].grad_req = "write"

    def replace_head(self, features: str, num_outputs: int, *, name: str = "head") -> None:
        """Drop everything after ``features`` and add a fresh dense layer on it (Xavier
        initialized from :func:`mixrt.random.generator`) as the model's only output."""
        graph = self.graph
        feature_type = static_type(graph, features)
        width = int(np.prod(feature_type.shape[1:]))
        flat = f"{name}.flatten"
        weight, bias, output = f"{name}.weight", f"{name}.bias", f"{name}.output"
        limit = np.sqrt(6.0 / (width + num_outputs))
        dtype = feature_type.dtype
        graph.initializers[weight] = mixrt_random.generator().uniform(
            -limit, limit, (num_outputs, width)).astype(dtype)
        graph.initializers[bias] = np.zeros(num_outputs, dtype=dtype)
        opset = graph.opsets.get("", 17)
        graph.nodes.append(Node("Flatten", [features], [flat], name=flat, opset=opset))
        graph.nodes.append(Node("Gemm", [flat, weight, bias], [output], name=f"{name}.gemm",
                                opset=opset, attributes={"transB": 1}))
        graph.outputs = [Value(output, TensorType(dtype, (feature_type.shape[0], num_outputs)))]
        eliminate_dead_nodes(graph)
        graph.initializers = {k: v for k, v in graph.initializers.items()
                              if k in {i for n in graph.nodes for i in n.inputs}}
        self.output = output
        kept = {k: p for k, p in self.params.items() if k in graph.initializers}
        self.params = ParameterDict(kept)
        for key in (weight, bias):
            self.params[key] = self._parameter(key, graph.initializers[key])
        self._changed(structure=True)

    # -- the graph with the current parameters ----------------------------------------------

    def to_graph(self) -> Graph:
        """The model with its current parameter values as initializers (export, compile)."""
        return self._graph_with_params()

    def _training_graph(self) -> Graph:
        """The graph a training program differentiates. A BatchNormalization in training
        mode reads its running statistics as fed inputs and outputs their new values, which
        each step stores (:meth:`_store_state`)."""
        graph = self._graph_with_params()
        self._state_updates = statistics_updates(graph, self._statistics)
        return graph

    def _graph_with_params(self) -> Graph:
        graph = copy_graph(self.graph)
        for name, param in self.params.items():
            graph.initializers[name] = np.array(to_host(param.raw()))  # a copy
        graph.outputs = [v for v in graph.outputs if v.name == self.output] or graph.outputs
        return graph

    def export_onnx(self, path, opset: int | None = None) -> None:
        save_model(self.to_graph(), path, opset=opset)

    def _changed(self, structure: bool = False) -> None:
        self._version += 1
        if structure:
            self._programs.clear()

    # -- inference (graph_inference.GraphInference) ------------------------------------------

    def predict(self, data, batch_size: int = 256) -> np.ndarray:
        """The output for an array of samples, ``batch_size`` at a time."""
        return self._inference.predict(data, batch_size)

    def score(self, eval_data: DataIter, metric="acc") -> tuple[str, float]:
        """``metric`` over every batch of ``eval_data``: (name, value)."""
        return self._inference.score(eval_data, metric)

    @property
    def _structure(self) -> int:
        return id(self.graph)


class SymbolModule(Module):
    """A Module over a Symbol, MXNet's ``mx.mod.Module(symbol, data_names, label_names)``
    (made by :meth:`Module.from_symbol`).

    The parameters are the symbol's arguments other than the data and the label, and its
    auxiliary states (BatchNorm's running statistics: not trained, updated by each training
    step). They are made when the data's shape is first known (:meth:`bind`, or the first
    ``fit``/``predict``/``score``), from the shapes the symbol infers, and initialized as
    MXNet's ``Module.init_params`` does by default: ``Uniform(0.01)`` for weights, by name
    zero for biases, betas and running means, one for gammas and running variances; a
    Variable's own ``init`` wins (LeakyReLU's prelu gamma: 0.25).

    Training (``fit``) runs the symbol in training mode (batch statistics, Dropout on).
    When the symbol's head is an MXNet output layer, the default loss is the one whose
    gradient is the layer's backward in MXNet, after MXNet's Module rescales gradients by
    1 / batch size (so the same optimizer settings train the same way):

    * SoftmaxOutput: softmax cross-entropy of the layer's input (the logits), summed over
      the batch and divided by its size ("null" normalization, the default), by its size
      twice ("batch") or by the labels not ignored and the size ("valid"); ``use_ignore``
      leaves out samples labelled ``ignore_label``;
    * LinearRegressionOutput: half the mean squared error (MXNet's gradient is
      ``(pred - label) / outputs per sample``, a mean squared error's gradient halved);
    * LogisticRegressionOutput: mean binary cross-entropy of the input as logits;
    * MAERegressionOutput: mean absolute error;

    each times ``grad_scale``; regression labels are reshaped to the prediction's shape.
    ``predict`` and ``score`` read the head's forward value (softmax probabilities, the
    sigmoid, ...), as MXNet's ``Module.predict`` returns it; ``predict`` also takes a data
    iterator. A symbol without an output layer trains with ``fit(loss=...)`` on its output
    (default softmax cross-entropy) against the label named in ``label_names``."""

    def __init__(self, symbol, data_names=("data",), label_names=None, *,
                 device: str = "cpu", initializer=None):
        if not isinstance(symbol, Symbol) or len(symbol) != 1:
            raise InputError(f"Module.from_symbol needs a Symbol with one output, got "
                             f"{symbol!r}")
        self.symbol = symbol
        self.head = output_layer(symbol)
        self.data_names = symbol_names(symbol, "data_names", data_names, required=True)
        labels = symbol_names(symbol, "label_names", label_names, required=False)
        self.label_name = self._chosen_label(labels)
        # what predict returns: the head's forward value, without the label
        self.prediction = symbol if self.head is None else self.head.prediction
        # MXNet's Module.init_params default
        self.initializer = Uniform(0.01) if initializer is None else create_initializer(
            initializer)
        self.device = device
        # Module.__init__ runs in bind(), once there is a graph; until then, no parameters
        self.graph = None
        self.params = ParameterDict()
        self.output = self.prediction.list_outputs()[0]
        self.loss_scaler = None
        self._programs, self._version = {}, 0
        self._inference = GraphInference(self)
        self._state_updates: dict[str, str] = {}  # aux state -> its new value's output

    def _chosen_label(self, labels: list[str]) -> str:
        head_label = None if self.head is None else self.head.label
        if labels and head_label is not None and labels[0] != head_label:
            raise InputError(f"label_names {labels} do not name the label of the symbol's "
                             f"{self.head.kind} layer, {head_label!r}")
        return labels[0] if labels else head_label or "label"

    # -- parameters --------------------------------------------------------------------------

    def bind(self, data_shape, dtype="float32") -> None:
        """Make and initialize the parameters for data of ``data_shape`` (the batch size
        does not matter: the model takes any); MXNet's ``bind`` + ``init_params``. A module
        already bound checks that the shape fits."""
        shape = tuple(int(d) for d in data_shape)
        if self.graph is not None:
            bound = self.graph.type_of(self.data_names[0]).shape
            if len(shape) != len(bound) or shape[1:] != tuple(bound[1:]):
                raise InputError(f"the module is bound to data of shape (batch, "
                                 f"{', '.join(map(str, bound[1:]))}); got {shape}")
            return
        data_dtype = np.dtype(dtype)
        values = self._initial_values(shape, data_dtype)
        graph = self.prediction.to_graph(values, name="module",
                                         shapes={self.data_names[0]: (None, *shape[1:])},
                                         dtypes={self.data_names[0]: data_dtype})
        data_names = self.data_names
        Module.__init__(self, graph, output=self.output, device=self.device)
        self.data_names = data_names  # not every graph input: the one the module feeds
        self.params = ParameterDict((name, self.params[name]) for name in values)
        for name in self.aux_names:
            self.params[name].grad_req = "null"

    @property
    def aux_names(self) -> list[str]:
        return self.prediction.list_auxiliary_states()

    def _initial_values(self, shape: tuple, data_dtype: np.dtype) -> dict:
        """MXNet's Module.init_params: a Variable's own init fills it whole; running means
        and variances start at 0 and 1 (what MXNet's BatchNorm declares for them); other
        parameters take the module's initializer by MXNet's name rules."""
        arg_shapes, _, aux_shapes = self.prediction.infer_shape(**{self.data_names[0]: shape})
        if arg_shapes is None:
            raise ShapeError(f"init_params: the data shape {shape} does not determine every "
                             f"parameter of {self.prediction.list_arguments()}")
        names = self.prediction.list_arguments() + self.aux_names
        declared = {node.name: node.info for node in self.prediction._variables()}
        dtype = data_dtype if data_dtype.kind == "f" else np.dtype(np.float32)
        values = {}
        for name, param_shape in zip(names, arg_shapes + aux_shapes):
            if name in self.data_names:
                continue
            value = np.zeros(param_shape, declared[name].get("dtype", dtype))
            start = starting_value(name, declared[name].get("init"), name in self.aux_names)
            if isinstance(start, float):
                value[...] = start
            elif start is not None:
                start._init_weight(name, value)
            elif hasattr(self.initializer, "fill_by_name"):
                self.initializer.fill_by_name(name, value)
            else:  # Load, Mixed: MXNet calls them with the name
                self.initializer(name, value)
            values[name] = value
        return values

    def init_params(self, initializer=None) -> None:
        """Initialize every parameter again (``initializer`` replaces the module's)."""
        if initializer is not None:
            self.initializer = create_initializer(initializer)
        bound = self._bound("init_params")
        shape = (1, *bound.type_of(self.data_names[0]).shape[1:])
        for name, value in self._initial_values(shape, self._data_dtype()).items():
            self.params[name].set_data(value)
        self._changed()

    def _data_dtype(self) -> np.dtype:
        return np.dtype(self._bound("init_params").type_of(self.data_names[0]).dtype)

    def _bound(self, what: str) -> Graph:
        if self.graph is None:
            raise InputError(f"{what}: the module has no parameters yet; call bind(data_shape) "
                             f"or fit/predict/score first")
        return self.graph

    def _bind_like(self, data) -> None:
        data = np.asarray(data) if array_module(data) is np else data
        self.bind(data.shape, data.dtype)

    def _bind_like_iter(self, data: DataIter) -> None:
        described = data.provide_data[0]
        self.bind(described.shape, described.dtype)

    def unfreeze(self, names=None) -> None:
        super().unfreeze(names)
        for name in self.aux_names:
            self.params[name].grad_req = "null"

    # -- training --------------------------------------------------------------------------

    def fit(self, train_data: DataIter, **options) -> list[dict]:
        self._bind_like_iter(train_data)
        return super().fit(train_data, **options)

    def train_step(self, data, label, trainer: Trainer, loss=None, **options):
        self._bind_like(data)
        return super().train_step(data, label, trainer, loss, **options)

    def _loss(self, loss) -> Loss:
        if isinstance(loss, Loss):
            return loss
        logits = self.output if self.head is None else self.head.logits.list_outputs()[0]
        if loss is None and self.head is not None:
            self._check_trainable_head(logits)
            return output_layer_loss(self.head.kind, self.head.options, logits,
                                     self.label_name)
        loss = "softmax_cross_entropy" if loss is None else loss
        if loss not in LOSSES:
            raise InputError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}")
        return LOSSES[loss](logits, self.label_name)

    def _check_trainable_head(self, logits: str) -> None:
        if self.head.label is None:
            raise InputError(f"the symbol's {self.head.kind} layer's label is not a "
                             f"Variable: the module cannot feed it")
        if self.head.options.get("preserve_shape"):
            rank = getattr(infer_types(self._bound("fit")).get(logits), "rank", None)
            if rank != 2:  # the loss takes classes on axis 1, preserve_shape on the last
                raise InputError(f"SoftmaxOutput(preserve_shape=True) on {rank}-d data "
                                 f"cannot be trained here (only 2-d); use multi_output=True "
                                 f"with the classes on axis 1")

    def _training_graph(self) -> Graph:
        """The graph in training form (batch statistics, Dropout on) with the running
        statistics as inputs fed each step and their new values as extra outputs."""
        graph = self._graph_with_params()
        for name in self.aux_names:
            array = graph.initializers.pop(name)
            graph.inputs.append(Value(name, TensorType(array.dtype, tuple(array.shape))))
        train, self._state_updates = training_graph(graph, self.aux_names)
        return train

    def _state_feeds(self) -> dict:
        return {name: self.params[name].raw() for name in self.aux_names}

    def _graph_with_params(self) -> Graph:
        self._bound("to_graph")
        return super()._graph_with_params()

    # -- inference -------------------------------------------------------------------------

    def predict(self, data, batch_size: int = 256) -> np.ndarray:
        """The head's forward value for an array of samples or for every batch of a data
        iterator (its padding left out), as MXNet's ``Module.predict``."""
        if not isinstance(data, DataIter):
            self._bind_like(data)
            return self._inference.predict(data, batch_size)
        self._bind_like_iter(data)
        return self._inference.predict_batches(data)

    def score(self, eval_data: DataIter, metric="acc") -> tuple[str, float]:
        self._bind_like_iter(eval_data)
        return self._inference.score(eval_data, metric)


