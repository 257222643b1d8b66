"""MXNet's op hook on a hybridized block (``HybridBlock.register_op_hook``).

While a block with a hook runs hybridized, each call of its traced graph is followed by a
second run of that graph which keeps every operator's outputs (``mixrt.sym.monitoring``),
and the hook is called with them, operator by operator in the graph's order: its inputs
first with ``monitor_all``, then its outputs. The imperative run that settles deferred
parameter shapes before a trace calls no hook: MXNet settles shapes without running anything.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

from mixrt import autograd
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.session import Session
from mixrt.sym import monitoring
from mixrt.sym.training_graphs import feeds_for, training_graph

# the imperative run trace() makes to settle deferred parameter shapes runs hybridized
# children, which call no op hook then: MXNet settles shapes without running anything
_settling = threading.local()


def install(block, callback, monitor_all: bool) -> None:
    """The hook on ``block`` and its direct children, as MXNet installs it."""
    block._op_hook = (callback, bool(monitor_all))
    for child in block._children.values():
        child._op_hook = block._op_hook


@contextlib.contextmanager
def settling_shapes():
    """The shape-settling run of a trace: hybridized blocks call no op hook within it."""
    _settling.depth = getattr(_settling, "depth", 0) + 1
    try:
        yield
    finally:
        _settling.depth -= 1


def wanted(block) -> bool:
    """Whether a call of ``block``'s traced graph is to be reported to its op hook."""
    return block._op_hook is not None and not getattr(_settling, "depth", 0)


def report(cached, compiled, arrays: list, ctx) -> None:
    """Call the hook of ``cached``'s block (a ``CachedGraph``) with every operator's values
    (its inputs first, with ``monitor_all``), each operator in the graph's order;
    ``compiled`` holds the Sessions of the inputs' signature."""
    block = cached.block
    callback, monitor_all = block._op_hook
    if block._flags.get("static_alloc") or block._flags.get("static_shape"):
        warnings.warn("register_op_hook is experimental when static_alloc=True / "
                      "static_shape=True and may not work correctly", stacklevel=3)
    feeds = {name: a._read() for name, a in zip(cached.input_names, arrays)}
    feeds.update({name: p.data(ctx)._read() for name, p in cached.params.items()})
    layers = monitoring.layers_of(cached.symbol)
    session = _monitored(compiled, ctx, layers, autograd.is_training())
    values = dict(feeds)
    values.update(zip(session.graph.output_names,
                      session.run_on_device(None, feeds_for(feeds, session))))
    for layer in layers:
        op_name = layer.op.encode()
        if monitor_all:
            for label, value in zip(layer.input_labels(), layer.inputs):
                if value in values:  # constants the graph folds have none
                    callback(label.encode(), op_name, NDArray(values[value], ctx))
        for value in layer.outputs:
            callback(value.encode(), op_name, NDArray(values[value], ctx))


def _monitored(compiled, ctx, layers: list, train: bool) -> Session:
    """The graph (its training form with ``train``) keeping every layer's outputs, made
    once per training mode and kept with ``compiled``'s other Sessions."""
    sessions = compiled.op_hook_sessions
    if train not in sessions:
        graph = training_graph(compiled.graph, compiled.aux)[0] if train else compiled.graph
        kept = monitoring.with_layer_outputs(graph, layers)
        sessions[train] = Session(kept, device=str(ctx.device))
    return sessions[train]
