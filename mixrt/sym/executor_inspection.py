"""Looking inside an Executor: MXNet's monitor callback and ``debug_str``.

``set_monitor_callback`` has each forward report every layer's outputs and each backward
the gradient each layer passes to each of its inputs, computed by sessions of their own
(``mixrt.sym.monitoring`` rewrites the graph for them); ``debug_str`` lists the nodes and
the memory the plans of a forward and backward at the bound shapes allocate.

Neither changes what the executor computes, so they stand apart from its running
(``mixrt.sym.executor_running``). :class:`Inspection` is a part of
``mixrt.sym.executor.Executor`` (its ``_inspection``; the Executor's
``set_monitor_callback`` and ``debug_str`` are its methods), which reads the executor's
arrays and sessions.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Value
from mixrt.runtime.session import Session
from mixrt.nd import NDArray
from mixrt.sym import monitoring
from mixrt.sym.executor_running import SignatureSessions
from mixrt.sym.training_graphs import feeds_for


class Inspection:
    """MXNet's ``set_monitor_callback`` and ``debug_str`` of ``executor``."""

    def __init__(self, executor):
        self.executor = executor
        self.monitor = None  # (callback, monitor_all)

    def set_monitor_callback(self, callback, monitor_all: bool = False) -> None:
        """Call ``callback(name, array)`` as MXNet's executor does: after each forward
        with every layer's outputs (``fc_0_output``; with ``monitor_all``, every argument
        and auxiliary state first), after each backward with the gradient each layer
        passes to each of its inputs (``fc_0_backward_output0``); see
        ``mixrt.sym.monitoring`` for how they are computed."""
        self.monitor = (callback, bool(monitor_all))

    def report_forward(self, compiled: SignatureSessions, feeds: dict,
                       is_train: bool) -> None:
        """The monitor's calls after a forward of ``feeds``."""
        executor, (callback, monitor_all) = self.executor, self.monitor
        if monitor_all:
            for name, array in {**executor.arg_dict, **executor.aux_dict}.items():
                callback(name, array)
        session = compiled.monitored_forward(executor.symbol, is_train)
        values = session.run_on_device(None, feeds_for(feeds, session))
        named = dict(zip(session.graph.output_names, values))
        for layer in monitoring.layers_of(executor.symbol):
            for name in layer.outputs:
                callback(name, NDArray(named[name], executor._ctx))

    def report_backward(self, out_grads, is_train: bool) -> None:
        """The monitor's calls after a backward with ``out_grads``."""
        executor, (callback, _) = self.executor, self.monitor
        compiled = executor._compiled_for_shapes()
        training, zeros = compiled.monitored_backward(executor.symbol, is_train)
        if training.backward is None:
            return
        feeds = {**executor._raw_feeds(),
                 **monitoring.zeros_feeds(training.forward.graph, zeros, executor._xp)}
        values = training.forward.run_on_device(None, feeds_for(feeds, training.forward))
        named = dict(zip(training.forward.graph.output_names, values))
        saved = {name: named[name] for name in training.saved}
        feeds.update(saved)
        feeds.update(executor._head_grads(out_grads, training))
        grads = training.backward.run_on_device(None, feeds_for(feeds, training.backward))
        by_value = dict(zip(training.wrt, grads))
        by_value.update({value: by_value[zero] for value, zero in zeros.items()
                         if zero in by_value})
        for layer in monitoring.layers_of(executor.symbol):
            for name, value in zip(layer.gradient_names(), layer.inputs):
                if value in by_value:
                    callback(name, NDArray(by_value[value], executor._ctx))

    def debug_str(self) -> str:
        """What the executor computes and holds: the symbol's outputs, its variables, each
        node with its inputs and attributes, and the memory its plans allocate
        (``Total <n> MB allocated``: the arenas of the sessions a forward and backward at
        the bound shapes run, rounded down)."""
        symbol = self.executor.symbol
        lines = ["Symbol Outputs:"]
        lines += [f"\toutput[{i}]={name}" for i, name in enumerate(symbol.list_outputs())]
        for node in symbol._topological():
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
        executor = self.executor
        compiled = executor._compiled_for_shapes()
        feeds = executor._raw_feeds()
        if not any(req != "null" for req in executor._grad_req.values()):
            return _arena_bytes(compiled.inference(), feeds)
        training = compiled.training()
        total = _arena_bytes(training.forward, feeds)
        if training.backward is not None:
            saved = {v.name: executor._xp.zeros(_static(v), _dtype(v))
                     for v in training.backward.graph.feed_inputs() if v.name not in feeds}
            # what the forward keeps for the backward is held between the two, as MXNet's
            # plan holds it
            total += sum(int(a.nbytes) for a in saved.values())
            total += _arena_bytes(training.backward, {**feeds, **saved})
        return total


def _input_name(entry) -> str:
    node, index = entry
    return node.output_name(index)


def _arena_bytes(session: Session, feeds: dict) -> int:
    return int(session.memory_plan(feeds_for(feeds, session)).arena_bytes)


def _static(value: Value) -> tuple:
    return tuple(int(d) for d in value.type.shape)


def _dtype(value: Value):
    return np.dtype(value.type.dtype)
