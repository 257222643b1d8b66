"""Executor: a Symbol bound to arrays, with forward and backward over planned arenas.

    executor = net.simple_bind("cpu", data=(32, 784), label=(32,))
    executor.init_params(mixrt.initializer.Xavier())
    outputs = executor.forward(is_train=True, data=x, label=y)
    executor.backward()                     # head gradients default to ones
    executor.grad_dict["fc1_weight"]        # d sum(outputs) / d fc1_weight

Three compiled graphs sit behind it, each a Session with its own memory plan:

* inference: the symbol as written (``forward(is_train=False)``);
* training forward: BatchNormalization in training mode (batch statistics, running
  statistics written back to the auxiliary arrays) and Dropout active; it also outputs the
  activations the backward needs;
* backward: reads those saved activations and the head gradients, writes the gradients.

The forward and backward are the two halves of one joint graph built by the autodiff
(``runtime/passes/autodiff.py``) and cut where the forward ends, so ``forward`` returns the
outputs before the head gradients are known, as MXNet's executor does.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GradientError, InputError, MixrtError, ShapeError
from mixrt.context import as_context
from mixrt.exporters.onnx import save_model
from mixrt.initializer import create, Xavier
from mixrt.ops.device import on_own_device, to_host
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph, split_forward_backward
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import copy_graph
from mixrt.runtime.session import Session
from mixrt.runtime.training import LOSS_OPSET, NameMaker
from mixrt.nd import NDArray
from mixrt.output_losses import output_layer_loss
from mixrt.sym import monitoring, symbol as symbol_module
from mixrt.sym.common_expr import eliminate_common_expr, enabled as common_expr_enabled
from mixrt.sym.symbol import DEFAULT_DTYPE, Group, LOSS_HEAD, Symbol
from mixrt.sym.symbol_layers import output_layer

TensorProto_INT64 = 7  # ONNX's element type code of int64 (Cast's ``to``)

GRAD_REQS = ("write", "add", "null")
HEAD_GRAD = "{}_head_grad"


class UnknownParameterError(InputError, ValueError):
    """``copy_params_from`` was given a name the symbol lacks (MXNet raises ValueError)."""


class Executor:
    """A Symbol bound to NDArrays (MXNet's ``mx.executor.Executor``).

    ``arg_dict``, ``grad_dict``, ``aux_dict`` and ``outputs`` are NDArrays the executor
    reads and writes in place, as MXNet's: an NDArray given to ``bind`` is used itself (its
    memory is the argument's), so ``arg_dict["x"][:] = v`` changes the next forward and
    ``backward`` writes into the ``args_grad`` arrays given. Host arrays are copied in."""

    def __init__(self, symbol: Symbol, ctx="cpu", args=None, args_grad=None,
                 grad_req="write", aux_states=None, *, opt_level: int = 1,
                 strategy: str = "greedy"):
        self.symbol = symbol
        self._ctx = as_context(ctx)
        self.device = self._ctx.device
        self._xp = self.device.xp
        self._options = dict(device=self.device, opt_level=opt_level, strategy=strategy)
        self._arg_names = symbol.list_arguments()
        self._aux_names = symbol.list_auxiliary_states()
        self._grad_req = _grad_reqs(grad_req, self._arg_names)
        with self.device.active():  # the bound arrays go to this device
            self.arg_dict = self._bound("args", args, self._arg_names)
            self.aux_dict = self._bound("aux_states", aux_states, self._aux_names)
            self.grad_dict = self._gradient_arrays(args_grad)
        self.data_names: list[str] = []  # arguments that are data, not parameters
        self._compiled: dict = {}  # shape signature -> _Compiled
        self._saved = None  # what the last training forward kept for backward
        self._saved_by = None  # the TrainingPair that forward ran
        self._inferred = False  # whether the last forward was an inference one
        self._monitor = None  # (callback, monitor_all)
        self._eliminate_common_expr = common_expr_enabled()
        self._optimized = None  # get_optimized_symbol's, made on first use
        self.outputs: list = self._output_arrays()

    # -- arrays ------------------------------------------------------------------------------

    @property
    def arg_arrays(self) -> list:
        return [self.arg_dict[n] for n in self._arg_names]

    @property
    def grad_arrays(self) -> list:
        return [self.grad_dict.get(n) for n in self._arg_names]

    @property
    def aux_arrays(self) -> list:
        return [self.aux_dict[n] for n in self._aux_names]

    @property
    def output_dict(self) -> dict:
        return dict(zip(self.symbol.list_outputs(), self.outputs))

    @property
    def grad_req(self) -> dict:
        return dict(self._grad_req)

    def _ndarray(self, value, name: str):
        """``value`` as an NDArray of this executor's context: an NDArray already there is
        used itself (shared memory), anything else is copied in."""
        if isinstance(value, NDArray) and _same_memory(value.ctx, self._ctx):
            return value
        if isinstance(value, NDArray):
            value = value.asnumpy()
        if value is None:
            raise InputError(f"bind: no array given for {name!r}")
        return NDArray(self.device.put(value), self._ctx)

    def _bound(self, what: str, given, names: list[str]) -> dict:
        if given is None:
            given = {}
        if isinstance(given, (list, tuple)):
            if len(given) != len(names):
                raise InputError(f"bind: {what} has {len(given)} arrays; the symbol has "
                                 f"{len(names)}: {names}")
            given = dict(zip(names, given))
        unknown = set(given) - set(names)
        if unknown:
            raise InputError(f"bind: {what} names {sorted(unknown)}, which the symbol does "
                             f"not have; expected names from {names}")
        missing = [n for n in names if n not in given]
        if missing:
            raise InputError(f"bind: {what} lacks arrays for {missing}; simple_bind "
                             f"allocates them from shapes")
        return {n: self._ndarray(given[n], n) for n in names}

    def _gradient_arrays(self, args_grad) -> dict:
        wanted = [n for n in self._arg_names if self._grad_req[n] != "null"]
        if isinstance(args_grad, (list, tuple)):
            args_grad = dict(zip(self._arg_names, args_grad))
        args_grad = args_grad or {}
        arrays = {}
        for name in wanted:
            given = args_grad.get(name)
            arrays[name] = self._zeros_like(self.arg_dict[name]) if given is None \
                else self._ndarray(given, name)
        return arrays

    def _zeros_like(self, array):
        return NDArray(self._xp.zeros(array.shape, array.dtype), self._ctx)

    def _output_arrays(self) -> list:
        """The output arrays, allocated at bind when the bound shapes determine them (as
        MXNet's are, so a reshaped executor can share them); otherwise at first forward."""
        try:
            shapes = {n: a.shape for n, a in {**self.arg_dict, **self.aux_dict}.items()}
            _, out_shapes, _ = self.symbol._known_shapes((), shapes)
            _, out_types, _ = self.symbol.infer_type(
                **{n: a.dtype for n, a in self.arg_dict.items()})
        except MixrtError:
            return []
        if any(s is None or None in s for s in out_shapes):
            return []
        with self.device.active():
            return [NDArray(self._xp.zeros(s, t or DEFAULT_DTYPE), self._ctx)
                    for s, t in zip(out_shapes, out_types)]

    @on_own_device
    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        """Copy parameter values in (shapes must match the bound arrays); names the symbol
        lacks are an error unless ``allow_extra_params``."""
        for source, target, what in ((arg_params, self.arg_dict, "argument"),
                                     (aux_params or {}, self.aux_dict, "auxiliary state")):
            for name, value in source.items():
                if name not in target:
                    if allow_extra_params:
                        continue
                    raise UnknownParameterError(
                        f"copy_params_from: the symbol has no {what} {name!r} "
                        f"(allow_extra_params=True skips such names)")
                _assign(target[name], name, value, self.device)

    @on_own_device
    def init_params(self, initializer=None, *, overwrite: bool = True) -> None:
        """Fill every parameter and auxiliary state (not the data arguments) with its
        Variable's own ``init`` when it declared one, else ``initializer`` (Xavier)."""
        default = create(initializer) if initializer is not None else Xavier()
        declared = {n.name: n.info for n in self.symbol._variables()}
        for target in (self.arg_dict, self.aux_dict):
            for name, array in target.items():
                if name in self.data_names or (not overwrite and np.any(array._read())):
                    continue
                init = declared[name].get("init")
                chosen = create(init) if init is not None else default
                value = chosen(name, array.shape, array.dtype)
                array._write()[...] = self.device.put(value)

    # -- leaving mixrt.sym --------------------------------------------------------------------

    def to_graph(self, data_names=None, outputs=None) -> Graph:
        """The inference graph with the current parameters and auxiliary states as
        initializers; ``data_names`` (default: the names given to simple_bind) stay inputs.
        ``outputs`` picks values by name from ``symbol.get_internals()`` (the logits of a
        training symbol, say) instead of the symbol's outputs."""
        symbol = self.symbol
        if outputs is not None:
            internals = symbol.get_internals()
            symbol = Group([internals[name] for name in outputs])
        data = list(self.data_names if data_names is None else data_names)
        arguments = symbol.list_arguments()
        if not data or set(data) - set(self._arg_names):
            raise InputError(f"to_graph: name the data arguments (which stay graph inputs) "
                             f"from {self._arg_names}; got {data}")
        data = [n for n in data if n in arguments]
        params = {n: _host(a) for n, a in {**self.arg_dict, **self.aux_dict}.items()
                  if n not in data and n in symbol.list_inputs()}
        shapes = {n: (None, *self.arg_dict[n].shape[1:]) for n in data}  # any batch size
        dtypes = {n: self.arg_dict[n].dtype for n in data}
        return symbol.to_graph(params, shapes=shapes, dtypes=dtypes)

    def export_onnx(self, path, opset: int | None = None, data_names=None, outputs=None):
        """Write the inference graph (see :meth:`to_graph`) as an ONNX model."""
        return save_model(self.to_graph(data_names, outputs), path, opset)

    # -- running -----------------------------------------------------------------------------

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
        if self._monitor is not None:  # what the monitor sees, before aux updates
            self._report_forward(compiled, feeds, is_train)
        if not is_train:
            self._saved, self._inferred = None, True
            values = compiled.inference().run_on_device(None, _only(feeds,
                                                                      compiled.inference()))
            return self._store_outputs(values)
        training = compiled.training()
        values = training.forward.run_on_device(None, _only(feeds, training.forward))
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
        values = training.forward.run_on_device(None, _only(self._raw_feeds(),
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
        grads = training.backward.run_on_device(None, _only(feeds, training.backward))
        for name, grad in zip(training.wrt, grads):
            target = self.grad_dict[name]._write()
            if self._grad_req[name] == "add":
                target += grad
            else:
                target[...] = grad
        if self._monitor is not None:
            self._report_backward(out_grads, training is not self._compiled_for_shapes()
                                  ._inference_training)

    def _head_grads(self, out_grads, training) -> dict:
        """The backward's seeds: ``out_grads`` (ones by default) for the outputs, ones
        for a loss head (make_loss, MakeLoss: MXNet's ignore the gradient given) and the
        batch size for an output layer's attached loss."""
        heads = {seed: self._xp.asarray(float(batch), dtype=dtype)
                 for seed, (batch, dtype) in training.loss_seeds().items()}
        seeded = training.seeded
        loss_heads = _loss_heads(self.symbol)
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

    def _compiled_for_shapes(self) -> "_Compiled":
        arrays = {**self.arg_dict, **self.aux_dict}
        shapes = {n: tuple(a.shape) for n, a in arrays.items()}
        key = tuple(sorted(shapes.items()))
        if key not in self._compiled:
            dtypes = {n: a.dtype for n, a in arrays.items()}
            graph = self.get_optimized_symbol().to_graph(shapes=shapes, dtypes=dtypes)
            wrt = [n for n in self._arg_names if self._grad_req[n] != "null"]
            self._compiled[key] = _Compiled(graph, wrt, self._aux_names, self._options,
                                            output_layers(self.symbol))
        return self._compiled[key]

    # -- MXNet's other executor calls ---------------------------------------------------------

    def get_optimized_symbol(self) -> Symbol:
        """The symbol this executor runs: with ``MXNET_ELIMINATE_COMMON_EXPR`` on (the
        default, read when the executor is made) each repeated computation done once
        (``mixrt.sym.common_expr``); otherwise the bound symbol itself."""
        if self._optimized is None:
            self._optimized = eliminate_common_expr(self.symbol) \
                if self._eliminate_common_expr else self.symbol
        return self._optimized

    def reshape(self, partial_shaping: bool = False, allow_up_sizing: bool = False,
                **kwargs) -> "Executor":
        """A new executor for new argument shapes (``name=shape``), sharing this one's
        memory: an array of the same size or smaller is a view of the old one (the first
        elements), a larger one is allocated only with ``allow_up_sizing``. Arguments whose
        shape changes without being named need ``partial_shaping``."""
        arg_shapes, out_shapes, aux_shapes = _inferred_shapes(self.symbol, kwargs, "reshape")
        resized = _Resizer(self._ctx, self.device, partial_shaping, allow_up_sizing, kwargs)
        args = {n: resized(n, self.arg_dict[n], s)
                for n, s in zip(self._arg_names, arg_shapes)}
        grads = {n: resized(n, self.grad_dict[n], s)
                 for n, s in zip(self._arg_names, arg_shapes) if n in self.grad_dict}
        aux = {n: resized(n, self.aux_dict[n], s)
               for n, s in zip(self._aux_names, aux_shapes)}
        executor = Executor(self.symbol, self._ctx, args, grads, self._grad_req, aux,
                            opt_level=self._options["opt_level"],
                            strategy=self._options["strategy"])
        executor.data_names = list(self.data_names)
        if len(self.outputs) == len(out_shapes):
            executor.outputs = [resized.view(old, shape, f"output {i}", named=True)
                                for i, (old, shape) in enumerate(zip(self.outputs,
                                                                     out_shapes))]
        return executor

    def set_monitor_callback(self, callback, monitor_all: bool = False) -> None:
        """Call ``callback(name, array)`` as MXNet's executor does: after each forward
        with every layer's outputs (``fc_0_output``; with ``monitor_all``, every argument
        and auxiliary state first), after each backward with the gradient each layer
        passes to each of its inputs (``fc_0_backward_output0``); see
        ``mixrt.sym.monitoring`` for how they are computed."""
        self._monitor = (callback, bool(monitor_all))

    def _report_forward(self, compiled: "_Compiled", feeds: dict, is_train: bool) -> None:
        callback, monitor_all = self._monitor
        if monitor_all:
            for name, array in {**self.arg_dict, **self.aux_dict}.items():
                callback(name, array)
        session = compiled.monitored_forward(self.symbol, is_train)
        values = session.run_on_device(None, _only(feeds, session))
        named = dict(zip(session.graph.output_names, values))
        for layer in monitoring.layers_of(self.symbol):
            for name in layer.outputs:
                callback(name, NDArray(named[name], self._ctx))

    def _report_backward(self, out_grads, is_train: bool) -> None:
        callback, _ = self._monitor
        compiled = self._compiled_for_shapes()
        training, zeros = compiled.monitored_backward(self.symbol, is_train)
        if training.backward is None:
            return
        feeds = {**self._raw_feeds(),
                 **monitoring.zeros_feeds(training.forward.graph, zeros, self._xp)}
        values = training.forward.run_on_device(None, _only(feeds, training.forward))
        named = dict(zip(training.forward.graph.output_names, values))
        saved = {name: named[name] for name in training.saved}
        feeds.update(saved)
        feeds.update(self._head_grads(out_grads, training))
        grads = training.backward.run_on_device(None, _only(feeds, training.backward))
        by_value = dict(zip(training.wrt, grads))
        by_value.update({value: by_value[zero] for value, zero in zeros.items()
                         if zero in by_value})
        for layer in monitoring.layers_of(self.symbol):
            for name, value in zip(layer.gradient_names(), layer.inputs):
                if value in by_value:
                    callback(name, NDArray(by_value[value], self._ctx))

    def debug_str(self) -> str:
        """What the executor computes and holds: the symbol's outputs, its variables, each
        node with its inputs and attributes, and the memory its plans allocate
        (``Total <n> MB allocated``: the arenas of the sessions a forward and backward at
        the bound shapes run, rounded down)."""
        lines = ["Symbol Outputs:"]
        lines += [f"\toutput[{i}]={name}" for i, name in
                  enumerate(self.symbol.list_outputs())]
        for node in self.symbol._topological():
            if node.is_variable or node.is_constant:
                lines.append(f"{'Variable' if node.is_variable else 'Constant'}:{node.name}")
                continue
            lines += ["--------------------", f"Op:{node.op}, Name={node.name}", "Inputs:"]
            lines += [f"\targ[{i}]={_input_name(entry)}" for i, entry in
                      enumerate(node.inputs) if entry is not None]
            if node.attrs:
                lines.append("Attrs:")
                lines += [f"\t{k}={v}" for k, v in node.attrs.items()]
        lines.append(f"Total {self._planned_bytes() // (1 << 20)} MB allocated")
        return "\n".join(lines) + "\n"

    def _planned_bytes(self) -> int:
        compiled = self._compiled_for_shapes()
        feeds = self._raw_feeds()
        if not any(req != "null" for req in self._grad_req.values()):
            return _arena_bytes(compiled.inference(), feeds)
        training = compiled.training()
        total = _arena_bytes(training.forward, feeds)
        if training.backward is not None:
            saved = {v.name: self._xp.zeros(_static(v), _dtype(v))
                     for v in training.backward.graph.feed_inputs() if v.name not in feeds}
            # what the forward keeps for the backward is held between the two, as MXNet's
            # plan holds it
            total += sum(int(a.nbytes) for a in saved.values())
            total += _arena_bytes(training.backward, {**feeds, **saved})
        return total


class _Resizer:
    """Arrays for :meth:`Executor.reshape`: the old array, a view of its first elements,
    or (``allow_up_sizing``) a new one."""

    def __init__(self, ctx, device, partial_shaping: bool, allow_up_sizing: bool,
                 named: dict):
        self.ctx, self.device = ctx, device
        self.partial_shaping, self.allow_up_sizing = partial_shaping, allow_up_sizing
        self.named = named

    def __call__(self, name: str, old, shape):
        return self.view(old, shape, repr(name), named=name in self.named)

    def view(self, old, shape, what: str, *, named: bool):
        shape = tuple(shape)
        if old.shape == shape:
            return old
        if not named and not self.partial_shaping:
            raise InputError(f"reshape: the shape of {what} changes from {old.shape} to "
                             f"{shape} without being given; pass partial_shaping=True to "
                             f"allow it")
        size = int(np.prod(shape))
        if size > old.size:
            if not self.allow_up_sizing:
                raise InputError(f"reshape: {what} grows from {old.shape} to {shape}; pass "
                                 f"allow_up_sizing=True to allocate a larger array")
            with self.device.active():
                return NDArray(self.device.xp.zeros(shape, old.dtype), self.ctx)
        flat = old._read().reshape(-1)
        return NDArray(flat[:size].reshape(shape), self.ctx)._share_memory_of(old)


def _same_memory(a, b) -> bool:
    """Whether arrays of contexts ``a`` and ``b`` live in the same memory: every host
    context (``cpu(0)``, ``cpu(1)``) is main memory, as in MXNet."""
    return a == b or (a.device_type == b.device_type == "cpu")


def _input_name(entry) -> str:
    node, index = entry
    return node.output_name(index)


def _arena_bytes(session: Session, feeds: dict) -> int:
    return int(session.memory_plan(_only(feeds, session)).arena_bytes)


def _static(value: Value) -> tuple:
    return tuple(int(d) for d in value.type.shape)


def _dtype(value: Value):
    return np.dtype(value.type.dtype)


class _Compiled:
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

    def inference_training(self) -> "TrainingPair":
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

    def training(self) -> "TrainingPair":
        if self._training is None:
            self._training = TrainingPair(self.graph, self.wrt, self.aux_names, self.options,
                                          output_layers=self.layers)
        return self._training


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


def _loss_heads(symbol: Symbol) -> set[int]:
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


def _only(feeds: dict, session: Session) -> dict:
    wanted = {v.name for v in session.graph.feed_inputs()}
    return {k: v for k, v in feeds.items() if k in wanted}


def _host(array) -> np.ndarray:
    return np.array(to_host(array._read() if isinstance(array, NDArray) else array))  # a copy: the graph must not change when training goes on


def _assign(target, name: str, value, device) -> None:
    value = device.put(value.asnumpy() if isinstance(value, NDArray) else value)
    if tuple(value.shape) != target.shape:
        raise InputError(f"{name!r}: the bound array has shape {target.shape}, the new "
                         f"value {tuple(value.shape)}")
    target._write()[...] = value


def _grad_reqs(grad_req, names: list[str]) -> dict[str, str]:
    if isinstance(grad_req, str):
        reqs = dict.fromkeys(names, grad_req)
    elif isinstance(grad_req, (list, tuple)):
        reqs = dict(zip(names, grad_req))
    elif isinstance(grad_req, dict):
        unknown = set(grad_req) - set(names)
        if unknown:
            raise InputError(f"grad_req names {sorted(unknown)}, which are not arguments")
        reqs = {n: grad_req.get(n, "null") for n in names}
    else:
        raise InputError(f"grad_req must be a string, a list or a dict; got {grad_req!r}")
    for name, req in reqs.items():
        if req not in GRAD_REQS:
            raise InputError(f"grad_req of {name!r} must be one of {GRAD_REQS}; got {req!r}")
    return reqs


def simple_bind(symbol: Symbol, ctx, grad_req, type_dict: dict, shapes: dict) -> Executor:
    """Allocate every argument and auxiliary array from the shapes inferred from ``shapes``
    (zeros) and bind; the names given in ``shapes`` are remembered as data arguments."""
    arg_shapes, _, aux_shapes = _inferred_shapes(symbol, shapes, "simple_bind")
    arg_types, _, aux_types = symbol.infer_type(**type_dict)

    def arrays(names, shape_list, type_list):
        return {n: np.zeros(s, dtype=t or DEFAULT_DTYPE)
                for n, s, t in zip(names, shape_list, type_list)}

    executor = Executor(symbol, ctx, arrays(symbol.list_arguments(), arg_shapes, arg_types),
                        None, _simple_bind_reqs(grad_req, symbol, arg_types),
                        arrays(symbol.list_auxiliary_states(), aux_shapes, aux_types))
    executor.data_names = [n for n in shapes if n in symbol.list_arguments()]
    return executor


def _inferred_shapes(symbol: Symbol, shapes: dict, what: str) -> tuple:
    """Every argument's and auxiliary state's shape from ``shapes``; arrays cannot be
    allocated otherwise, so one left unknown is a ShapeError naming it (as MXNet's)."""
    inferred = symbol._known_shapes((), shapes)
    names = symbol.list_arguments() + symbol.list_auxiliary_states()
    unknown = {name: tuple(0 if d is None else d for d in shape or ())
               for name, shape in zip(names, inferred[0] + inferred[2])
               if shape is None or None in shape}
    if unknown:
        raise ShapeError(f"{what}: cannot decide the shapes of {unknown} (0 is an unknown "
                         f"dimension) from the shapes given, {shapes}; give them too")
    if any(shape is None or None in shape for shape in inferred[1]):
        given = dict(zip(symbol.list_arguments(), inferred[0]))
        raise ShapeError(f"{what}: the outputs {symbol.list_outputs()} have no shape for "
                         f"the argument shapes {given}; their operators do not accept them "
                         f"together")
    return inferred


def _simple_bind_reqs(grad_req, symbol: Symbol, arg_types: list):
    """A plain grad_req string is every float argument's, data and labels included
    (MXNet's simple_bind); an integer argument (class labels, indices) has no gradient to
    hold and gets none."""
    if not isinstance(grad_req, str):
        return grad_req
    return {name: grad_req if np.dtype(dtype or DEFAULT_DTYPE).kind in "fc" else "null"
            for name, dtype in zip(symbol.list_arguments(), arg_types)}


symbol_module.hand_in(Executor=Executor, simple_bind=simple_bind)
