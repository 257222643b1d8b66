"""The gradient of If.

An If runs one of two branch graphs, and what its outputs depend on is what the branches
read from the enclosing graph (ONNX's outer scope): those names are the node's inputs in all
but name, and autodiff asks for their gradients after the node's listed inputs
(``autodiff.gradient_targets``).

The gradient is another If on the same condition. Each of its branches is the backward
graph of the forward's branch, built by ``gradient_graph`` itself: the branch's nodes again
(the forward branch's intermediate values die with its scope, so they are recomputed), then
their backward nodes seeded with dY, giving the gradient of every captured float value,
zeros for one the branch does not read. So an If inside a branch, or an op with an
expansion, differentiates as it does at the top level, and the backward If differentiates
again (second order).

Loop and Scan have no gradient yet.
"""

from __future__ import annotations

from mixrt.ops import control
from mixrt.runtime.graph import Graph, Node, Value, outer_scope_reads
from mixrt.runtime.passes.rewrite import NameMaker, all_names, copy_graph, eliminate_dead_nodes

BRANCHES = ("then_branch", "else_branch")


@control.if_.grad
def _(b, node, dy):
    from mixrt.runtime.passes.autodiff import gradient_targets  # noqa: PLC0415 (a cycle)
    targets = gradient_targets(node)
    captured = [name for name in targets[len(node.inputs):] if b.differentiable(name)]
    seeds = {index: grad for index, grad in enumerate(dy) if grad is not None}
    if not captured or not seeds:
        return []
    branches = {key: _backward_branch(b, node, key, captured, seeds) for key in BRANCHES}
    grads = b.emit("If", node.inputs[0], outputs=len(captured), **branches)
    by_name = dict(zip(captured, (grads,) if len(captured) == 1 else grads))
    return [None] * len(node.inputs) + [by_name.get(name) for name in
                                        targets[len(node.inputs):]]


def _backward_branch(b, node: Node, key: str, captured: list[str], seeds: dict) -> Graph:
    """The branch ``key`` of ``node`` turned into the graph of d(sum_i dY_i . Y_i) / d c for
    each captured c, reading c, the dY and whatever else the branch reads from outside."""
    from mixrt.runtime.passes.autodiff import gradient_graph  # noqa: PLC0415 (a cycle)
    branch = node.attributes[key]
    forward = copy_graph(branch)
    seeded = _seeded_outputs(forward, seeds)
    reads = dict.fromkeys([*captured, *outer_scope_reads(branch), *seeded.values()])
    forward.inputs = [Value(name, b.types.get(name)) for name in reads]
    forward.outputs = [Value(name) for name in seeded]
    result = gradient_graph(forward, next(iter(seeded)), captured, keep_outputs=False,
                            seeds=seeded, differentiable_backward=b.differentiable_backward)
    backward = result.graph
    backward.name = b.fresh(f"{node.label}_{key}_grad")
    backward.inputs = []  # each of them is read from the enclosing graph instead
    backward.outputs = [Value(result.grads[name], b.types.get(name)) for name in captured]
    eliminate_dead_nodes(backward)  # the loss output is gone: so are nodes only it needed
    _rename_definitions(backward, b.fresh)
    return backward


def _seeded_outputs(forward: Graph, seeds: dict) -> dict[str, str]:
    """{Identity of output i: dY_i} for each seeded output. The Identity gives every output
    a name of its own, even one that is a captured value or appears twice."""
    names = NameMaker(forward)
    seeded = {}
    for index, grad in seeds.items():
        name = names(f"{forward.output_names[index]}_seeded")
        forward.nodes.append(Node("Identity", [forward.output_names[index]], [name],
                                  name=name, opset=13))
        seeded[name] = grad
    return seeded


def _rename_definitions(graph: Graph, fresh) -> None:
    """Give every name the graph defines, at any depth, a name fresh in the enclosing graph:
    the backward nodes were named without seeing it, and a subgraph may not redefine a
    name of its scope."""
    outside = set(outer_scope_reads(graph))
    mapping = {name: fresh(name) for name in sorted(all_names(graph) - outside)}
    _apply(graph, mapping)


def _apply(graph: Graph, mapping: dict) -> None:
    rename = lambda name: mapping.get(name, name)  # noqa: E731
    graph.inputs = [Value(rename(v.name), v.type) for v in graph.inputs]
    graph.outputs = [Value(rename(v.name), v.type) for v in graph.outputs]
    graph.initializers = {rename(k): v for k, v in graph.initializers.items()}
    graph.value_types = {rename(k): v for k, v in graph.value_types.items()}
    for node in graph.nodes:
        node.inputs = [rename(name) for name in node.inputs]
        node.outputs = [rename(name) for name in node.outputs]
        node.name = rename(node.name) if node.name in mapping else node.name
        for sub in node.subgraphs():
            _apply(sub, mapping)
