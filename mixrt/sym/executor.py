"""Executor: a Symbol bound to arrays, with forward and backward over planned arenas.

    executor = net.simple_bind("cpu", data=(32, 784), label=(32,))
    executor.init_params(mixrt.initializer.Xavier())
    outputs = executor.forward(is_train=True, data=x, label=y)
    executor.backward()                     # head gradients default to ones
    executor.grad_dict["fc1_weight"]        # d sum(outputs) / d fc1_weight

This module binds (``bind``, ``simple_bind``, ``reshape``) and leaves mixrt.sym
(``to_graph``, ``export_onnx``); the Executor's other concerns live beside it, one module
each:

* ``executor_arrays.py``: the bound arrays, grad_req, the parameters filled in (a base of
  :class:`Executor`: its arrays are the executor's own attributes, as MXNet's);
* ``executor_running.py``: forward and backward over the sessions of each shape signature
  (inference, training forward, backward), as MXNet's executor runs them: ``forward``
  returns the outputs before the head gradients are known (a base too: running is what
  an executor is);
* ``executor_inspection.py``: the monitor callback and ``debug_str``, a part with a name of
  its own (``_inspection``), which the two methods of that name hand to;
* ``training_graphs.py``: the training form of a graph and its forward/backward pair, which
  Gluon's hybridized blocks and the Graph Module run too.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.exporters.onnx import save_model
from mixrt.ops.device import to_host
from mixrt.runtime.graph import Graph
from mixrt.nd import NDArray
from mixrt.sym import symbol as symbol_module
from mixrt.sym.common_expr import eliminate_common_expr, enabled as common_expr_enabled
from mixrt.sym.executor_arrays import (BoundArrays, grad_reqs, inferred_shapes, Resizer,
                                       simple_bind_reqs)
from mixrt.sym.executor_inspection import Inspection
from mixrt.sym.executor_running import Running
from mixrt.sym.symbol import DEFAULT_DTYPE, Group, Symbol
# names this module held before the split, for the code that imports them from here
from mixrt.sym.executor_arrays import GRAD_REQS, UnknownParameterError  # noqa: F401
from mixrt.sym.training_graphs import (HEAD_GRAD, output_layers,  # noqa: F401
                                       training_graph, TrainingPair)


class Executor(BoundArrays, Running):
    """A Symbol bound to NDArrays (MXNet's ``mx.executor.Executor``).

    ``arg_dict``, ``grad_dict``, ``aux_dict`` and ``outputs`` are NDArrays the executor
    reads and writes in place, as MXNet's: an NDArray given to ``bind`` is used itself (its
    memory is the argument's), so ``arg_dict["x"][:] = v`` changes the next forward and
    ``backward`` writes into the ``args_grad`` arrays given. Host arrays are copied in.

    ``__init__`` sets the state its bases read: the arrays (``BoundArrays``) and the caches
    of compiled sessions and saved activations (``Running``); the monitor is its part
    ``_inspection``'s."""

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
        self._grad_req = grad_reqs(grad_req, self._arg_names)
        with self.device.active():  # the bound arrays go to this device
            self.arg_dict = self._bound("args", args, self._arg_names)
            self.aux_dict = self._bound("aux_states", aux_states, self._aux_names)
            self.grad_dict = self._gradient_arrays(args_grad)
        self.data_names: list[str] = []  # arguments that are data, not parameters
        self._compiled: dict = {}  # shape signature -> SignatureSessions
        self._saved = None  # what the last training forward kept for backward
        self._saved_by = None  # the TrainingPair that forward ran
        self._inferred = False  # whether the last forward was an inference one
        self._inspection = Inspection(self)  # the monitor and debug_str
        self._eliminate_common_expr = common_expr_enabled()
        self._optimized = None  # get_optimized_symbol's, made on first use
        self.outputs: list = self._output_arrays()

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

    # -- MXNet's other executor calls ---------------------------------------------------------

    def set_monitor_callback(self, callback, monitor_all: bool = False) -> None:
        """Call ``callback(name, array)`` after each forward and backward, as MXNet's
        executor does (``executor_inspection.Inspection.set_monitor_callback``)."""
        self._inspection.set_monitor_callback(callback, monitor_all)

    def debug_str(self) -> str:
        """The symbol's nodes and the memory its plans allocate
        (``executor_inspection.Inspection.debug_str``)."""
        return self._inspection.debug_str()

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
        arg_shapes, out_shapes, aux_shapes = inferred_shapes(self.symbol, kwargs, "reshape")
        resized = Resizer(self._ctx, self.device, partial_shaping, allow_up_sizing, kwargs)
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


def _host(array) -> np.ndarray:
    # a copy: the graph must not change when training goes on
    return np.array(to_host(array._read() if isinstance(array, NDArray) else array))


def simple_bind(symbol: Symbol, ctx, grad_req, type_dict: dict, shapes: dict) -> Executor:
    """Allocate every argument and auxiliary array from the shapes inferred from ``shapes``
    (zeros) and bind; the names given in ``shapes`` are remembered as data arguments."""
    arg_shapes, _, aux_shapes = inferred_shapes(symbol, shapes, "simple_bind")
    arg_types, _, aux_types = symbol.infer_type(**type_dict)

    def arrays(names, shape_list, type_list):
        return {n: np.zeros(s, dtype=t or DEFAULT_DTYPE)
                for n, s, t in zip(names, shape_list, type_list)}

    executor = Executor(symbol, ctx, arrays(symbol.list_arguments(), arg_shapes, arg_types),
                        None, simple_bind_reqs(grad_req, symbol, arg_types),
                        arrays(symbol.list_auxiliary_states(), aux_shapes, aux_types))
    executor.data_names = [n for n in shapes if n in symbol.list_arguments()]
    return executor


symbol_module.hand_in(Executor=Executor, simple_bind=simple_bind)
