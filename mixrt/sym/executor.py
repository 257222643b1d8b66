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

from mixrt.base.errors import GradientError, InputError
from mixrt.exporters.onnx import save_model
from mixrt.initializer import create, Xavier
from mixrt.ops.device import on_own_device, parse_device, to_host
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph, split_forward_backward
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import copy_graph
from mixrt.runtime.session import Session
from mixrt.sym import symbol as symbol_module
from mixrt.sym.symbol import DEFAULT_DTYPE, Group, Symbol

GRAD_REQS = ("write", "add", "null")
HEAD_GRAD = "{}_head_grad"


class Executor:
    def __init__(self, symbol: Symbol, ctx="cpu", args=None, args_grad=None,
                 grad_req="write", aux_states=None, *, opt_level: int = 1,
                 strategy: str = "greedy"):
        self.symbol = symbol
        self.device = parse_device(ctx)
        self._xp = self.device.xp
        self._options = dict(device=self.device, opt_level=opt_level, strategy=strategy)
        self._arg_names = symbol.list_arguments()
        self._aux_names = symbol.list_auxiliary_states()
        self._grad_req = _grad_reqs(grad_req, self._arg_names)
        with self.device.active():  # the bound arrays go to this device
            self.arg_dict = self._bound("args", args, self._arg_names)
            self.aux_dict = self._bound("aux_states", aux_states, self._aux_names)
            self.grad_dict = self._gradient_arrays(args_grad)
        self.outputs: list = []
        self.data_names: list[str] = []  # arguments that are data, not parameters
        self._compiled: dict = {}  # shape signature -> _Compiled
        self._saved = None  # what the last training forward kept for backward

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
        return {n: self.device.put(given[n]) for n in names}

    def _gradient_arrays(self, args_grad) -> dict:
        wanted = [n for n in self._arg_names if self._grad_req[n] != "null"]
        if isinstance(args_grad, (list, tuple)):
            args_grad = dict(zip(self._arg_names, args_grad))
        args_grad = args_grad or {}
        arrays = {}
        for name in wanted:
            given = args_grad.get(name)
            arrays[name] = self._xp.zeros_like(self.arg_dict[name]) if given is None \
                else self.device.put(given)
        return arrays

    @on_own_device
    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        """Copy parameter values in (shapes must match the bound arrays)."""
        for source, target, what in ((arg_params, self.arg_dict, "argument"),
                                     (aux_params or {}, self.aux_dict, "auxiliary state")):
            for name, value in source.items():
                if name not in target:
                    if allow_extra_params:
                        continue
                    raise InputError(f"copy_params_from: the symbol has no {what} {name!r}")
                _assign(target, name, value, self.device)

    @on_own_device
    def init_params(self, initializer=None, *, overwrite: bool = True) -> None:
        """Fill every parameter and auxiliary state (not the data arguments) with its
        Variable's own ``init`` when it declared one, else ``initializer`` (Xavier)."""
        default = create(initializer) if initializer is not None else Xavier()
        declared = {n.name: n.info for n in self.symbol._variables()}
        for target in (self.arg_dict, self.aux_dict):
            for name, array in target.items():
                if name in self.data_names or (not overwrite and np.any(array)):
                    continue
                init = declared[name].get("init")
                chosen = create(init) if init is not None else default
                target[name][...] = self.device.put(chosen(name, array.shape, array.dtype))

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
        """Run the forward pass; ``kwargs`` replace bound arguments (by name) first.
        With ``is_train``, BatchNormalization uses batch statistics (and updates the running
        ones), Dropout drops, and what backward needs is kept. The outputs are arrays of the
        executor's device (CuPy arrays on a GPU), as the bound arrays are."""
        for name, value in kwargs.items():
            self._set_argument(name, value)
        compiled = self._compiled_for_shapes()
        feeds = {**self.arg_dict, **self.aux_dict}
        if not is_train:
            self._saved = None
            self.outputs = compiled.inference().run_on_device(
                None, _only(feeds, compiled.inference()))
            return self.outputs
        training = compiled.training()
        values = training.forward.run_on_device(None, _only(feeds, training.forward))
        named = dict(zip(training.forward.graph.output_names, values))
        for aux, output in training.aux_updates.items():
            self.aux_dict[aux][...] = named[output]
        self.outputs = [named[name] for name in training.model_outputs]
        self._saved = {name: named[name] for name in training.saved}
        return self.outputs

    @on_own_device
    def backward(self, out_grads=None) -> None:
        """Gradients of the outputs (weighted by ``out_grads``, ones by default) with
        respect to every argument whose grad_req is not "null", into ``grad_dict``."""
        if self._saved is None:
            raise GradientError("backward() needs a forward(is_train=True) first (the "
                                "last forward was not a training one)")
        training = self._compiled_for_shapes().training()
        if training.backward is None:
            return
        heads = self._head_grads(out_grads, training)
        feeds = {**self.arg_dict, **self.aux_dict, **self._saved, **heads}
        grads = training.backward.run_on_device(None, _only(feeds, training.backward))
        for name, grad in zip(training.wrt, grads):
            if self._grad_req[name] == "add":
                self.grad_dict[name] += grad
            else:
                self.grad_dict[name][...] = grad

    def _head_grads(self, out_grads, training) -> dict:
        seeded = training.seeded
        if out_grads is None:
            return {HEAD_GRAD.format(name): self._xp.ones_like(self.outputs[i])
                    for i, name in seeded}
        if not isinstance(out_grads, (list, tuple)):
            out_grads = [out_grads]
        if len(out_grads) != len(self.outputs):
            raise InputError(f"backward: {len(out_grads)} head gradients for "
                             f"{len(self.outputs)} outputs {self.symbol.list_outputs()}")
        heads = {}
        for i, name in seeded:
            grad = self.device.put(out_grads[i])
            if grad.shape != self.outputs[i].shape:
                raise InputError(f"backward: the head gradient of output {name!r} has shape "
                                 f"{grad.shape}; the output has {self.outputs[i].shape}")
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
        value = self.device.put(value)
        if value.shape == target[name].shape:
            target[name][...] = value
            return
        # a new batch size: rebind this array (plans are cached per shape signature)
        target[name] = value.astype(target[name].dtype, copy=False)
        if name in self.grad_dict:
            self.grad_dict[name] = self._xp.zeros_like(target[name])

    def _compiled_for_shapes(self) -> "_Compiled":
        shapes = {n: tuple(a.shape) for n, a in {**self.arg_dict, **self.aux_dict}.items()}
        key = tuple(sorted(shapes.items()))
        if key not in self._compiled:
            dtypes = {n: a.dtype for n, a in {**self.arg_dict, **self.aux_dict}.items()}
            graph = self.symbol.to_graph(shapes=shapes, dtypes=dtypes)
            wrt = [n for n in self._arg_names if self._grad_req[n] != "null"]
            self._compiled[key] = _Compiled(graph, wrt, self._aux_names, self._options)
        return self._compiled[key]


class _Compiled:
    """The sessions for one shape signature, made when first needed."""

    def __init__(self, graph: Graph, wrt: list[str], aux_names: list[str], options: dict):
        self.graph, self.wrt, self.aux_names, self.options = graph, wrt, aux_names, options
        self._inference = self._training = None

    def inference(self) -> Session:
        if self._inference is None:
            self._inference = Session(self.graph, **self.options)
        return self._inference

    def training(self) -> "TrainingPair":
        if self._training is None:
            self._training = TrainingPair(self.graph, self.wrt, self.aux_names, self.options)
        return self._training


class TrainingPair:
    """The training forward and the backward Session of one shape signature.
    ``train=False`` differentiates the graph as written (inference-form BatchNormalization
    and Dropout): what ``autograd.record(train_mode=False)`` asks of a hybridized block."""

    def __init__(self, graph: Graph, wrt: list[str], aux_names: list[str], options: dict,
                 train: bool = True):
        train, self.aux_updates = training_graph(graph, aux_names) if train else \
            (copy_graph(graph), {})
        self.model_outputs = graph.output_names
        self.wrt = list(wrt)
        types = _output_types(train)
        self.seeded = [(i, name) for i, name in enumerate(self.model_outputs)
                       if _is_float(types.get(name))]
        if not self.wrt or not self.seeded:
            self.forward, self.backward, self.saved = Session(train, **options), None, []
            return
        for _, name in self.seeded:
            train.inputs.append(Value(HEAD_GRAD.format(name), types.get(name)))
        seeds = {name: HEAD_GRAD.format(name) for _, name in self.seeded}
        joint = gradient_graph(train, self.seeded[0][1], self.wrt, seeds=seeds)
        split = split_forward_backward(joint)
        self.saved = split.saved
        self.forward = Session(split.forward, **options)
        self.backward = Session(split.backward, **options)
        grad_order = {joint.grads[w]: w for w in self.wrt}
        self.wrt = [grad_order[name] for name in split.backward.output_names]


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
    return np.array(to_host(array))  # a copy: the graph must not change when training goes on


def _assign(target: dict, name: str, value, device) -> None:
    value = device.put(value)
    if value.shape != target[name].shape:
        raise InputError(f"{name!r}: the bound array has shape {tuple(target[name].shape)}, "
                         f"the new value {tuple(value.shape)}")
    target[name][...] = value


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
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    arg_types, _, aux_types = symbol.infer_type(**type_dict)

    def arrays(names, shape_list, type_list):
        return {n: np.zeros(s, dtype=t or DEFAULT_DTYPE)
                for n, s, t in zip(names, shape_list, type_list)}

    executor = Executor(symbol, ctx, arrays(symbol.list_arguments(), arg_shapes, arg_types),
                        None, _data_no_grad(grad_req, symbol, shapes),
                        arrays(symbol.list_auxiliary_states(), aux_shapes, aux_types))
    executor.data_names = [n for n in shapes if n in symbol.list_arguments()]
    return executor


def _data_no_grad(grad_req, symbol: Symbol, shapes: dict):
    """A plain grad_req string covers the parameters; data and labels (the names given
    shapes) get none, as MXNet's Module binds them."""
    if not isinstance(grad_req, str):
        return grad_req
    return {n: ("null" if n in shapes else grad_req) for n in symbol.list_arguments()}


symbol_module.hand_in(Executor=Executor, simple_bind=simple_bind)
