"""The backward of one imperative op, compiled from the op's own gradient definition.

An imperative op's gradient is the same ``@op.grad`` function the symbolic autodiff uses
(``runtime/passes/autodiff.py``): for each distinct call signature (op, attributes, input
types, which inputs want a gradient) we build the one-node graph, let ``gradient_graph``
append its backward nodes, cut off the forward half and compile the backward half into a
Session. A training loop makes the same calls every step, so after the first step every
backward is a cache hit and one planned ``Session.run``.

Some gradients read an output the forward does not produce by default (Dropout's mask,
SoftmaxCrossEntropyLoss's log-probabilities); ``forward_outputs`` says how many outputs the
recorded forward must therefore ask its kernel for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.lru import LruCache, frozen
from mixrt.runtime.passes.autodiff import (gradient_graph, is_differentiable_dtype,
                                           split_forward_backward)
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import Session

_SYMBOL_OPSET = 21  # what mixrt.sym builds at; backward nodes of the default domain use 17


@dataclass(frozen=True)
class Signature:
    """Everything the compiled backward depends on (hashable: the cache key)."""

    domain: str
    op_type: str
    opset: int
    attributes: tuple  # sorted (name, frozen value)
    inputs: tuple  # (dtype str, shape) or None per input
    wants_grad: tuple  # bool per input
    outputs: int  # outputs the caller asked for
    device: str  # "cpu" or "gpu:N": the backward session runs there


@dataclass
class ForwardPlan:
    produced: int  # outputs the kernel must produce (>= the caller's)
    float_outputs: tuple  # indices of outputs that can carry a gradient
    error: GradientError | None  # set when the op has no gradient to build


@dataclass
class BackwardPlan:
    session: object  # runtime Session of the backward half (a Graph for create_graph)
    feeds: list  # (feed name, "x"|"y"|"dy", index)
    grads: list  # input index per session output


# Compiled per call signature (shapes included), so a workload whose shapes keep changing
# would keep every one; the backward plans hold Sessions with their arenas.
_forward_plans = LruCache(4096)
_backward_plans = LruCache(512)


def signature(spec, attributes: dict, raw: list, wants: list, outputs: int,
              device: str) -> Signature:
    inputs = tuple(None if r is None else (r.dtype.str, tuple(r.shape)) for r in raw)
    return Signature(spec.domain, spec.op_type, spec.opset, frozen(attributes), inputs,
                     tuple(wants), outputs, device)


def differentiable(raw) -> bool:
    return raw is not None and is_differentiable_dtype(raw.dtype)


def forward_plan(sig: Signature, attributes: dict) -> ForwardPlan:
    plan = _forward_plans.get(sig)
    if plan is None:
        plan = _forward_plans.put(sig, _build_forward_plan(sig, attributes))
    return plan


def backward_plan(sig: Signature, attributes: dict, seeded: tuple) -> BackwardPlan:
    key = (sig, seeded)
    plan = _backward_plans.get(key)
    if plan is None:
        plan = _backward_plans.put(key, _build_backward_plan(sig, attributes, seeded))
    return plan


def clear_cache() -> None:
    _forward_plans.clear()
    _backward_plans.clear()


# -- building -------------------------------------------------------------------------------

def _one_node_graph(sig: Signature, attributes: dict, outputs: int):
    names = ["" if t is None else f"x{i}" for i, t in enumerate(sig.inputs)]
    ys = [f"y{j}" for j in range(outputs)]
    node = Node(sig.op_type, names, ys, name=f"{sig.op_type.lower()}_imperative",
                domain=sig.domain, opset=sig.opset, attributes=dict(attributes))
    inputs = [Value(n, TensorType(np.dtype(t[0]), t[1])) for n, t in zip(names, sig.inputs)
              if t is not None]
    opsets = {"": _SYMBOL_OPSET}
    opsets[sig.domain] = sig.opset if sig.domain else max(sig.opset, _SYMBOL_OPSET)
    graph = Graph("imperative", inputs=inputs, outputs=[Value(y) for y in ys], nodes=[node],
                  opsets=opsets)
    types = infer_types(graph)
    return graph, node, types


def _gradient(sig: Signature, attributes: dict, outputs: int, seeded, *,
              differentiable_backward: bool = False):
    graph, node, types = _one_node_graph(sig, attributes, outputs)
    if seeded is None:
        seeded = tuple(j for j in range(outputs) if _float(types.get(f"y{j}")))
    seeds = {f"y{j}": f"dy{j}" for j in seeded}
    for j in seeded:
        graph.inputs.append(Value(f"dy{j}", types.get(f"y{j}")))
    wrt = [f"x{i}" for i, wants in enumerate(sig.wants_grad) if wants]
    if not wrt or not seeds:
        return None, seeded
    joint = gradient_graph(graph, f"y{seeded[0]}", wrt, seeds=seeds,
                           differentiable_backward=differentiable_backward)
    return joint, seeded


def _build_forward_plan(sig: Signature, attributes: dict) -> ForwardPlan:
    _, _, types = _one_node_graph(sig, attributes, sig.outputs)
    floats = tuple(j for j in range(sig.outputs) if _float(types.get(f"y{j}")))
    try:
        joint, _ = _gradient(sig, attributes, sig.outputs, floats)
    except GradientError as exc:
        return ForwardPlan(sig.outputs, floats, exc)
    if joint is None:
        return ForwardPlan(sig.outputs, floats, None)
    forward = next(n for n in joint.graph.nodes if n.name == f"{sig.op_type.lower()}"
                   "_imperative")
    return ForwardPlan(max(sig.outputs, len(forward.outputs)), floats, None)


def recorded_backward(sig: Signature, attributes: dict, seeded: tuple) -> BackwardPlan:
    """The backward half as a plain graph (``session`` holds the Graph), for
    ``create_graph``: autograd replays it op by op so the tape records its ops."""
    key = ("graph", sig, seeded)
    plan = _backward_plans.get(key)
    if plan is None:
        backward, feeds, input_of = _backward_half(sig, attributes, seeded,
                                                   differentiable=True)
        grads = [input_of[name] for name in backward.output_names]
        plan = _backward_plans.put(key, BackwardPlan(backward, feeds, grads))
    return plan


def _backward_half(sig: Signature, attributes: dict, seeded: tuple, *,
                   differentiable: bool = False):
    """(backward graph, its feeds as (name, "x"|"y"|"dy", index), {gradient name: the
    input index it is the gradient of}). ``differentiable``: written to be differentiated
    again (see ``gradient_graph``'s ``differentiable_backward``)."""
    produced = forward_plan(sig, attributes).produced
    joint, _ = _gradient(sig, attributes, produced, seeded,
                         differentiable_backward=differentiable)
    backward = split_forward_backward(joint).backward
    feeds = [(name, name[:2] if name.startswith("dy") else name[0], int(name.lstrip("dxy")))
             for name in backward.input_names]
    return backward, feeds, {grad: int(x[1:]) for x, grad in joint.grads.items()}


def _build_backward_plan(sig: Signature, attributes: dict, seeded: tuple) -> BackwardPlan:
    backward, feeds, input_of = _backward_half(sig, attributes, seeded)
    session = Session(backward, device=sig.device)
    return BackwardPlan(session, feeds, [input_of[name] for name in session.graph.output_names])


def _float(value_type) -> bool:
    dtype = getattr(value_type, "dtype", None)
    return dtype is not None and is_differentiable_dtype(dtype)

