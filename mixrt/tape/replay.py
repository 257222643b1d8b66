"""A gradient graph run op by op through ``mixrt.nd``, so the tape records what it does.

``autograd.grad(..., create_graph=True)`` needs gradients that are themselves
differentiable (a gradient penalty, a Hessian-vector product). An op's backward is normally
one compiled Session run (``opgrad.backward_plan``), which the tape cannot see into; here the
same backward graph, unoptimized, runs node by node as imperative calls at each node's own
opset, while recording is on. Each of those calls is then an ordinary tape node, whose
gradient is again the registry's. An op in a backward graph that has no gradient of its own
(a backward-only kernel such as MaxPoolGrad) makes the *second* backward raise the usual
GradientError naming it.
"""

from __future__ import annotations

from mixrt.tape.arrays import new_array
from mixrt import dispatch


def replay(graph, feeds: dict, ctx) -> list:
    """The outputs of ``graph`` (NDArrays) computed from ``feeds`` ({input name: NDArray})."""
    values = dict(feeds)
    with ctx.device.active():
        for name, constant in graph.initializers.items():
            values[name] = new_array(ctx.xp.asarray(constant), ctx)
        for node in graph.nodes:
            args = [values[name] if name else None for name in node.inputs]
            results = dispatch.invoke(node.domain, node.op_type, args, dict(node.attributes),
                                      len(node.outputs), opset=node.opset)
            results = results if isinstance(results, tuple) else (results,)
            values.update((name, value) for name, value in zip(node.outputs, results)
                          if name)
    return [values[name] for name in graph.output_names]
