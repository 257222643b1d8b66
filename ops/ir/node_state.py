"""Work a kernel does once per node rather than once per run.

A session gives each node whose kernel takes ``_node`` a dict of its own (runtime/binding.py).
A kernel keeps there what it makes of its attributes (a tree ensemble's packed forest, an
n-gram table), and with :func:`prepared` also a call that computes the node from its inputs
alone, which the executor then makes instead of calling the kernel with every attribute again
(runtime/run_loop.py ``node_state``).
"""

from __future__ import annotations


def cached(node_state, build):
    """``build()``, kept in the node's ``_node`` dict (a session's node builds it once)."""
    if node_state is None:
        return build()
    model = node_state.get("model")
    if model is None:
        model = node_state["model"] = build()
    return model


def prepared(node_state, build):
    """As :func:`cached`, for a model whose ``run(xp, *inputs)`` computes the node from its
    inputs alone: the session's executor calls that directly from the node's next run on,
    without binding the attributes again (a tree ensemble's twenty keyword arguments cost
    ~3 us a call)."""
    model = cached(node_state, build)
    if node_state is not None:
        node_state["call"] = model.run
    return model
