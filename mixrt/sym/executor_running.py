"""How an Executor runs: its forward and backward over the sessions of each shape signature.

Three compiled graphs sit behind a signature (the bound arrays' shapes), each a Session
with its own memory plan, made when first needed (:class:`SignatureSessions`):

* inference: the symbol as written (``forward(is_train=False)``);
* training forward: BatchNormalization in training mode (batch statistics, running
  statistics written back to the auxiliary arrays) and Dropout active; it also outputs the
  activations the backward needs;
* backward: reads those saved activations and the head gradients, writes the gradients.

The training forward and the backward are a ``TrainingPair``
(``mixrt.sym.training_graphs``); the monitor's sessions (``mixrt.sym.monitoring``) are
kept with the others. :class:`Running` is a base of ``mixrt.sym.executor.Executor``,
whose ``__init__`` sets the arrays and caches its methods read; it stands apart from the
arrays (``mixrt.sym.executor_arrays``) as the computing does from the memory.
"""

from __future__ import annotations

from mixrt.base.errors import GradientError, InputError
from mixrt.ops.device import on_own_device
from mixrt.runtime.graph import Graph
from mixrt.runtime.session import Session
from mixrt.nd import NDArray
from mixrt.sym import monitoring
from mixrt.sym.symbol import Symbol
from mixrt.sym.training_graphs import (feeds_for, HEAD_GRAD, loss_head_indices, output_layers,
                                       training_graph, TrainingPair)


class Running:
    """MXNet's ``forward`` and ``backward``: feeds from the bound arrays, results written
    into ``outputs``, the auxiliary states and ``grad_dict`` in place."""

    @on_own_device
    def forward(self, is_train: bool = False, **kwargs) -> list:
        """Run the forward pass; ``kwargs`` are copied into the bound arguments (by name)
        first. With ``is_train``, BatchNormalization uses batch statistics (and updates the
        running ones), Dropout drops, and what backward needs is kept. Returns ``outputs``,
        NDArrays on the executor's context."""
        for name, value in kwargs.items():
            self._set_argument(name, value)
        compiled = self._compiled_for_shapes()
        feeds = self._raw_feeds()
        if self._inspection.monitor is not None:  # what it sees, before aux updates
            self._inspection.report_forward(compiled, feeds, is_train)
        if not is_train:
            self._saved, self._inferred = None, True
            session = compiled.inference()
            values = session.run_on_device(None, feeds_for(feeds, session))
            return self._store_outputs(values)
        training = compiled.training()
        values = training.forward.run_on_device(None, feeds_for(feeds, training.forward))
        named = dict(zip(training.forward.graph.output_names, values))
        for aux, output in training.aux_updates.items():
            self.aux_dict[aux]._write()[...] = named[output]
        self._saved = {name: named[name] for name in training.saved}
        self._saved_by = training
        return self._store_outputs([named[name] for name in training.model_outputs])

    def _replay_forward_for_backward(self) -> None:
        """Backward after ``forward(is_train=False)``, as MXNet allows: the graph as
        written (inference-form BatchNorm and Dropout) is differentiated at the same
        inputs, its forward run again to keep what backward reads."""
        if not self._inferred:
            raise GradientError("backward() needs a forward first")
        training = self._compiled_for_shapes().inference_training()
        values = training.forward.run_on_device(None, feeds_for(self._raw_feeds(),
                                                                training.forward))
        named = dict(zip(training.forward.graph.output_names, values))
        self._saved = {name: named[name] for name in training.saved}
        self._saved_by = training

    def _raw_feeds(self) -> dict:
        return {n: a._read() for n, a in {**self.arg_dict, **self.aux_dict}.items()}

    def _store_outputs(self, values: list) -> list:
        """Write the new values into the output arrays (kept, as MXNet's are, so views of
        them see the values); an output whose shape changed gets a new array."""
        for index, value in enumerate(values):
            if index < len(self.outputs) and self.outputs[index].shape == tuple(value.shape) \
                    and self.outputs[index].dtype == value.dtype:
                self.outputs[index]._write()[...] = value
            elif index < len(self.outputs):
                self.outputs[index] = NDArray(value, self._ctx)
            else:
                self.outputs.append(NDArray(value, self._ctx))
        del self.outputs[len(values):]
        return self.outputs

    @on_own_device
    def backward(self, out_grads=None, is_train: bool = True) -> None:
        """Gradients of the outputs (weighted by ``out_grads``, ones by default) with
        respect to every argument whose grad_req is not "null", into ``grad_dict``. An MXNet
        output layer (SoftmaxOutput, the regression outputs) gives its own loss gradient,
        whatever its head gradient, as in MXNet."""
        del is_train
        if self._saved is None:
            self._replay_forward_for_backward()
        training = self._saved_by
        if training.backward is None:
            return
        heads = self._head_grads(out_grads, training)
        feeds = {**self._raw_feeds(), **self._saved, **heads}
        grads = training.backward.run_on_device(None, feeds_for(feeds, training.backward))
        for name, grad in zip(training.wrt, grads):
            target = self.grad_dict[name]._write()
            if self._grad_req[name] == "add":
                target += grad
            else:
                target[...] = grad
        if self._inspection.monitor is not None:
            self._inspection.report_backward(out_grads, training is not self._compiled_for_shapes()
                                  ._inference_training)

    def _head_grads(self, out_grads, training) -> dict:
        """The backward's seeds: ``out_grads`` (ones by default) for the outputs, ones
        for a loss head (make_loss, MakeLoss: MXNet's ignore the gradient given) and the
        batch size for an output layer's attached loss."""
        heads = {seed: self._xp.asarray(float(batch), dtype=dtype)
                 for seed, (batch, dtype) in training.loss_seeds().items()}
        seeded = training.seeded
        loss_heads = loss_head_indices(self.symbol)
        heads.update({HEAD_GRAD.format(name): self._xp.ones_like(self.outputs[i]._read())
                      for i, name in seeded if out_grads is None or i in loss_heads})
        if out_grads is None:
            return heads
        if not isinstance(out_grads, (list, tuple)):
            out_grads = [out_grads]
        if len(out_grads) != len(self.outputs):
            raise InputError(f"backward: {len(out_grads)} head gradients for "
                             f"{len(self.outputs)} outputs {self.symbol.list_outputs()}")
        for i, name in seeded:
            if i in loss_heads:
                continue
            given = out_grads[i]
            grad = given._read() if isinstance(given, NDArray) else self.device.put(given)
            if tuple(grad.shape) != self.outputs[i].shape:
                raise InputError(f"backward: the head gradient of output {name!r} has shape "
                                 f"{tuple(grad.shape)}; the output has {self.outputs[i].shape}")
            heads[HEAD_GRAD.format(name)] = grad.astype(self.outputs[i].dtype, copy=False)
        return heads

    def _set_argument(self, name: str, value) -> None:
        if name in self.arg_dict:
            target = self.arg_dict
        elif name in self.aux_dict:
            target = self.aux_dict
        else:
            raise InputError(f"forward: the symbol has no argument {name!r}; arguments are "
                             f"{self._arg_names}")
        raw = value._read() if isinstance(value, NDArray) and value.ctx == self._ctx \
            else self.device.put(value.asnumpy() if isinstance(value, NDArray) else value)
        if tuple(raw.shape) == target[name].shape:
            target[name]._write()[...] = raw
            return
        # a new batch size: rebind this array (plans are cached per shape signature)
        target[name] = NDArray(raw.astype(target[name].dtype, copy=True), self._ctx)
        if name in self.grad_dict:
            self.grad_dict[name] = self._zeros_like(target[name])

    def _compiled_for_shapes(self) -> SignatureSessions:
        arrays = {**self.arg_dict, **self.aux_dict}
        shapes = {n: tuple(a.shape) for n, a in arrays.items()}
        key = tuple(sorted(shapes.items()))
        if key not in self._compiled:
            dtypes = {n: a.dtype for n, a in arrays.items()}
            graph = self.get_optimized_symbol().to_graph(shapes=shapes, dtypes=dtypes)
            wrt = [n for n in self._arg_names if self._grad_req[n] != "null"]
            self._compiled[key] = SignatureSessions(graph, wrt, self._aux_names,
                                                    self._options, output_layers(self.symbol))
        return self._compiled[key]


class SignatureSessions:
    """The sessions for one shape signature, made when first needed."""

    def __init__(self, graph: Graph, wrt: list[str], aux_names: list[str], options: dict,
                 layers: dict | None = None):
        self.graph, self.wrt, self.aux_names, self.options = graph, wrt, aux_names, options
        self.layers = layers or {}
        self._inference = self._training = self._inference_training = None
        self._monitoring: dict = {}  # (what, is_train) -> a monitor's Session or pair

    def inference(self) -> Session:
        if self._inference is None:
            self._inference = Session(self.graph, **self.options)
        return self._inference

    def inference_training(self) -> TrainingPair:
        """The graph as written, differentiated (backward after an inference forward)."""
        if self._inference_training is None:
            self._inference_training = TrainingPair(self.graph, self.wrt, self.aux_names,
                                                    self.options, train=False,
                                                    output_layers=self.layers)
        return self._inference_training

    def monitored_forward(self, symbol: Symbol, is_train: bool) -> Session:
        """The forward (training form with ``is_train``) keeping every layer's outputs."""
        key = ("forward", is_train)
        if key not in self._monitoring:
            graph = training_graph(self.graph, self.aux_names)[0] if is_train else self.graph
            kept = monitoring.with_layer_outputs(graph, monitoring.layers_of(symbol))
            self._monitoring[key] = Session(kept, **self.options)
        return self._monitoring[key]

    def monitored_backward(self, symbol: Symbol, is_train: bool) -> tuple:
        """(a TrainingPair over the graph whose computed layer inputs are read through
        zeros, {value: its zeros input}), differentiated with respect to those zeros and
        to the arguments the layers read."""
        key = ("backward", is_train)
        if key not in self._monitoring:
            layers = monitoring.layers_of(symbol)
            graph, zeros = monitoring.perturbed(self.graph, layers)
            wrt = monitoring.differentiable_inputs(graph, layers)
            wrt = [name for name in wrt if name not in zeros.values()] + list(zeros.values())
            pair = TrainingPair(graph, wrt, self.aux_names, self.options, train=is_train,
                                output_layers=self.layers,
                                read_as=monitoring.read_names(zeros))
            self._monitoring[key] = (pair, zeros)
        return self._monitoring[key]

    def training(self) -> TrainingPair:
        if self._training is None:
            self._training = TrainingPair(self.graph, self.wrt, self.aux_names, self.options,
                                          output_layers=self.layers)
        return self._training

