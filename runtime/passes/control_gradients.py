"""The gradients of If, Scan and Loop.

They live in the runtime rather than beside the ops in ``ops/control/``: each builds graphs
(the IR is the runtime's) and differentiates a subgraph with autodiff itself, which the
gradient builder hands in (``b.gradient_graph``, ``b.gradient_targets``), so ``ops/`` never
imports the runtime. ``runtime/passes/__init__.py`` imports this module, which registers
them on the control ops' kernels.

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

Scan's gradient is backpropagation through the iterations: the forward Scan is made to
record each iteration's incoming states, and a second Scan walks the iterations in reverse
with a body built the same way (the forward body recomputed at the recorded states, then
differentiated), carrying the states' gradients and summing those of the captured values.

Loop's gradient is the same with the iteration count known only at run time: the records
include each iteration's number, and a backward Loop runs that many times, reading the
records backward with Gather.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.control import control
from mixrt.ops.ir.types import TensorType
from mixrt.ops.shape.shape_grad import zeros_like
from mixrt.runtime.graph import Graph, Node, Value, outer_scope_reads
from mixrt.runtime.passes.rewrite import NameMaker, all_names, copy_graph, eliminate_dead_nodes

BRANCHES = ("then_branch", "else_branch")


@control.if_.grad
def _(b, node, dy):
    outer, captured = _captures(b, node)
    seeds = {index: grad for index, grad in enumerate(dy) if grad is not None}
    if not captured or not seeds:
        return []
    branches = {key: _backward_branch(b, node, key, captured, seeds) for key in BRANCHES}
    grads = _names(b.emit("If", node.inputs[0], outputs=len(captured), **branches))
    return _per_target(node, outer, {}, dict(zip(captured, grads)))


def _captures(b, node: Node) -> tuple[list[str], list[str]]:
    """The names the node's subgraphs read from the enclosing graph (the gradient targets
    after its inputs), and those of them that carry a gradient."""
    outer = b.gradient_targets(node)[len(node.inputs):]
    return outer, [name for name in outer if b.differentiable(name)]


def _names(emitted) -> tuple:
    """``b.emit``'s result as a tuple whatever the output count."""
    return (emitted,) if isinstance(emitted, str) else emitted


def _per_target(node: Node, outer: list[str], by_input: dict, by_capture: dict) -> list:
    """One gradient (or None) per gradient target: by input position, then by captured
    name."""
    return [by_input.get(i) for i in range(len(node.inputs))] + [
        by_capture.get(name) for name in outer]


def _backward_branch(b, node: Node, key: str, captured: list[str], seeds: dict) -> Graph:
    """The branch ``key`` of ``node`` turned into the graph of d(sum_i dY_i . Y_i) / d c for
    each captured c, reading c, the dY and whatever else the branch reads from outside."""
    branch = node.attributes[key]
    backward, grads = _body_gradient(b, branch, captured, seeds, wrt=captured)
    backward.name = b.fresh(f"{node.label}_{key}_grad")
    backward.inputs = []  # each of them is read from the enclosing graph instead
    backward.outputs = [Value(grads[name], b.types.get(name)) for name in captured]
    _finish(backward, b.fresh)
    return backward


def _body_gradient(b, body: Graph, captured: list[str], seeds: dict, *, wrt: list[str],
                   also_reads: tuple = ()):
    """``gradient_graph`` of a copy of ``body`` seeded with ``seeds`` ({output index: seed
    name}) for the names in ``wrt`` (its own inputs or captured ones): the joint graph, whose
    inputs are the body's inputs, then what it reads from outside, then the seeds; and
    {wrt name: gradient name}. The caller sets the outputs it wants. ``also_reads``: outer
    names the caller's own nodes will read, listed so no backward node is given one."""
    forward = copy_graph(body)
    seeded = _seeded_outputs(forward, seeds)
    own = forward.input_names
    outside = [name for name in dict.fromkeys([*captured, *outer_scope_reads(body),
                                               *seeded.values(), *also_reads])
               if name not in own]
    forward.inputs = forward.inputs + [Value(name, b.types.get(name)) for name in outside]
    forward.outputs = [Value(name) for name in seeded]
    result = b.gradient_graph(forward, next(iter(seeded)), list(wrt), keep_outputs=False,
                            seeds=seeded, differentiable_backward=b.differentiable_backward)
    return result.graph, result.grads


def _finish(graph: Graph, fresh) -> None:
    """Drop what only the loss output needed, then rename into the enclosing name space."""
    eliminate_dead_nodes(graph)
    _rename_definitions(graph, fresh)


# -- Scan -------------------------------------------------------------------------------------

@control.scan.grad
def _(b, node, dy):
    """Backpropagation through the scan: the forward Scan also records each iteration's
    incoming states (extra scan outputs), and a second Scan walks the iterations in reverse
    with a body that recomputes the forward body at those states and differentiates it,
    carrying the states' gradients and the sums of the captured values' gradients."""
    scan = _ScanLayout(node)
    outer, captured = _captures(b, node)
    if all(grad is None for grad in dy):
        return []
    recorded = _record_states(b, node, scan)
    float_states = [i for i in range(scan.states) if _is_float(b, node, scan.body, i)]
    float_inputs = [j for j in range(scan.scan_inputs)
                    if _is_float(b, node, scan.body, scan.states + j)]
    seeded_outputs = [k for k in range(scan.scan_outputs) if dy[scan.states + k] is not None]
    body = _reverse_body(b, node, scan, captured, float_states, float_inputs, seeded_outputs)
    initial = [dy[i] if dy[i] is not None else zeros_like(b, node.inputs[i])
               for i in float_states]
    inputs = [*initial, *(zeros_like(b, name) for name in captured), *recorded,
              *node.inputs[scan.states:], *(dy[scan.states + k] for k in seeded_outputs)]
    outputs = b.emit("Scan", *inputs, outputs=len(float_states) + len(captured)
                     + len(float_inputs), opset=node.opset, body=body,
                     num_scan_inputs=scan.states + scan.scan_inputs + len(seeded_outputs),
                     scan_input_directions=[1] * scan.states
                     + [1 - d for d in scan.input_directions]
                     + [1 - scan.output_directions[k] for k in seeded_outputs],
                     scan_input_axes=[0] * scan.states + scan.input_axes
                     + [scan.output_axes[k] for k in seeded_outputs],
                     scan_output_directions=[1 - scan.input_directions[j]
                                             for j in float_inputs],
                     scan_output_axes=[scan.input_axes[j] for j in float_inputs])
    outputs = _names(outputs)
    by_input = {i: outputs[n] for n, i in enumerate(float_states)}
    by_input.update({scan.states + j: outputs[len(float_states) + len(captured) + n]
                     for n, j in enumerate(float_inputs)})
    return _per_target(node, outer, by_input,
                       dict(zip(captured, outputs[len(float_states):])))


class _ScanLayout:
    """A Scan node's counts, axes and directions, defaults filled in."""

    def __init__(self, node: Node):
        attributes = node.attributes
        self.scan_inputs = int(attributes["num_scan_inputs"])
        self.states = len(node.inputs) - self.scan_inputs
        self.body = attributes["body"]
        self.scan_outputs = len(self.body.outputs) - self.states
        self.input_directions = list(attributes.get("scan_input_directions")
                                     or [0] * self.scan_inputs)
        self.input_axes = list(attributes.get("scan_input_axes") or [0] * self.scan_inputs)
        self.output_directions = list(attributes.get("scan_output_directions")
                                      or [0] * self.scan_outputs)
        self.output_axes = list(attributes.get("scan_output_axes") or [0] * self.scan_outputs)


def _is_float(b, node: Node, body: Graph, index: int) -> bool:
    """Whether input ``index`` carries a gradient: by the body's declared input type, which
    is kept where inference of control-flow outputs is not (recorded states), else by the
    node's input's type."""
    declared = body.inputs[index].type
    if isinstance(declared, TensorType) and declared.dtype is not None:
        return b.differentiable_dtype(declared.dtype)
    return bool(node.inputs[index]) and b.differentiable(node.inputs[index])


def _record_states(b, node: Node, scan: _ScanLayout) -> list[str]:
    """Make the forward Scan also output each iteration's incoming states, stacked on axis 0
    in iteration order; returns their names."""
    states = scan.body.inputs[:scan.states]
    # typed, so that inference (a second gradient) knows an int state is not float
    types = [state.type or TensorType(b.dtype(outer), None)
             for state, outer in zip(states, node.inputs)]
    recorded = _record_inputs(b, node, states, types, scan.states + scan.scan_outputs,
                              "states")
    node.attributes = dict(node.attributes,
                           scan_output_directions=scan.output_directions + [0] * scan.states,
                           scan_output_axes=scan.output_axes + [0] * scan.states)
    return recorded


def _record_inputs(b, node: Node, inputs: list[Value], types: list, outputs_before: int,
                   label: str) -> list[str]:
    """Make the forward node's body also output each of ``inputs`` as it came in (an
    Identity each, declared with ``types``), which the node stacks after its first
    ``outputs_before`` outputs; returns the stacked outputs' names. The forward node is the
    joint graph's own copy, so the model's graph is untouched."""
    body = copy_graph(node.attributes["body"])
    names = NameMaker(body)
    for value, value_type in zip(inputs, types):
        kept = names(f"{value.name}_at_step")
        body.nodes.append(Node("Identity", [value.name], [kept], name=kept, opset=13))
        body.outputs.append(Value(kept, value_type))
    recorded = [b.fresh(f"{node.label}_{label}_{i}") for i in range(len(inputs))]
    node.attributes = dict(node.attributes, body=body)
    node.outputs = [*node.outputs, *[""] * (outputs_before - len(node.outputs)), *recorded]
    for name, value_type in zip(recorded, types):  # dtype known: an int state stays one
        b.types[name] = TensorType(value_type.dtype, None)
    return recorded


def _reverse_body(b, node: Node, scan: _ScanLayout, captured: list[str],
                  float_states: list[int], float_inputs: list[int],
                  seeded_outputs: list[int]) -> Graph:
    """The backward Scan's body. Inputs: the states' gradients (carried), the captured
    values' gradient sums (carried), the forward body's own inputs at this iteration
    (recorded states, scan input elements), then the seeded scan outputs' gradients.
    Outputs: the states' gradients one iteration earlier, the sums, and the scan input
    elements' gradients."""
    body = scan.body
    names = NameMaker(body)
    own = body.input_names
    state_grads = {own[i]: names(f"d_{own[i]}") for i in float_states}
    output_grads = {scan.states + k: names(f"d_{body.output_names[scan.states + k]}")
                    for k in seeded_outputs}
    seeds = {i: state_grads[own[i]] for i in float_states}
    seeds.update(output_grads)
    wrt = [own[i] for i in float_states] + [own[scan.states + j] for j in float_inputs]
    backward, grads = _body_gradient(b, body, captured, seeds, wrt=[*wrt, *captured])
    names = NameMaker(backward)  # what this adds must not meet the backward nodes' names
    sums_in = [names(f"sum_d_{name}") for name in captured]
    sums_out = []
    for name, total in zip(captured, sums_in):
        summed = names(f"{total}_next")
        backward.nodes.append(Node("Add", [total, grads[name]], [summed], name=summed,
                                   opset=13))
        sums_out.append(summed)
    # declared, or the node input's dtype: what tells a later gradient which are floats
    element_types = {v.name: v.type or TensorType(b.dtype(outer), None)
                     for v, outer in zip(body.inputs, node.inputs)}
    backward.inputs = [*(Value(state_grads[own[i]], element_types.get(own[i]))
                         for i in float_states),
                       *(Value(name, b.types.get(c)) for name, c in zip(sums_in, captured)),
                       *(Value(name, element_types.get(name)) for name in own),
                       *(Value(output_grads[k]) for k in sorted(output_grads))]
    # typed like what they are gradients of: a scan of zero iterations shapes its
    # outputs from the body's declared types
    backward.outputs = [*(Value(grads[own[i]], element_types[own[i]]) for i in float_states),
                        *(Value(name, b.types.get(c)) for name, c in zip(sums_out, captured)),
                        *(Value(grads[own[scan.states + j]], element_types[own[scan.states + j]])
                          for j in float_inputs)]
    backward.name = b.fresh(f"{node.label}_body_grad")
    _finish(backward, b.fresh)
    return backward


# -- Loop -------------------------------------------------------------------------------------

@control.loop.grad
def _(b, node, dy):
    """As Scan's, with the iterations counted at run time: the forward Loop records each
    iteration's number and incoming states, and a backward Loop runs as many times, its
    body reading iteration T-1-i of the records (Gather) and of the scan outputs' dY."""
    if all(grad is None for grad in dy):
        return []
    body = node.attributes["body"]
    states = len(node.inputs) - 2
    scan_outputs = len(body.outputs) - 1 - states
    outer, captured = _captures(b, node)
    iterations, recorded = _record_loop(b, node, states, scan_outputs)
    float_states = [k for k in range(states) if _is_float(b, node, body, 2 + k)]
    seeded = [k for k in range(scan_outputs) if dy[states + k] is not None]
    count = b.emit("Shape", iterations, start=0, end=1)
    last = b.emit("Squeeze", b.emit("Sub", count, b.ints([1])), b.ints([0]))
    backward = _reverse_loop_body(b, node, captured, float_states, recorded,
                                  [dy[states + k] for k in seeded], seeded, last)
    initial = [dy[k] if dy[k] is not None else zeros_like(b, node.inputs[2 + k])
               for k in float_states]
    outputs = b.emit("Loop", count, None, *initial, *(zeros_like(b, c) for c in captured),
                     outputs=len(float_states) + len(captured), opset=node.opset,
                     body=backward)
    outputs = _names(outputs)
    by_input = {2 + k: outputs[n] for n, k in enumerate(float_states)}
    return _per_target(node, outer, by_input, dict(zip(captured, outputs[len(float_states):])))


def _record_loop(b, node: Node, states: int, scan_outputs: int):
    """Make the forward Loop also output, stacked, each iteration's number and incoming
    states; returns (iteration numbers, [recorded state per state])."""
    body = node.attributes["body"]
    types = [TensorType(np.dtype(np.int64), ())] + [
        v.type or TensorType(b.dtype(outer), None)
        for v, outer in zip(body.inputs[2:], node.inputs[2:])]
    recorded = _record_inputs(b, node, [body.inputs[0], *body.inputs[2:]], types,
                              states + scan_outputs, "record")
    return recorded[0], recorded[1:]


def _reverse_loop_body(b, node: Node, captured: list[str], float_states: list[int],
                       recorded: list[str], scan_grads: list[str], seeded: list[int],
                       last: str) -> Graph:
    """The backward Loop's body: inputs (i, cond, the states' gradients, the captured
    values' gradient sums); it reads iteration t = last - i of the records and of the scan
    outputs' dY, recomputes the forward body there and returns (cond, the states' gradients
    one iteration earlier, the sums)."""
    body = node.attributes["body"]
    states = len(node.inputs) - 2
    names = NameMaker(body)
    own = body.input_names
    state_grads = [names(f"d_{own[2 + k]}") for k in float_states]
    element_grads = [names(f"d_{body.output_names[1 + states + k]}") for k in seeded]
    seeds = {1 + k: grad for k, grad in zip(float_states, state_grads)}
    seeds.update({1 + states + k: grad for k, grad in zip(seeded, element_grads)})
    wrt = [own[2 + k] for k in float_states]
    backward, grads = _body_gradient(b, body, captured, seeds, wrt=[*wrt, *captured],
                                     also_reads=(*recorded, *scan_grads, last))
    names = NameMaker(backward)  # what this adds must not meet the backward nodes' names
    step, keep_going = names("backward_step"), names("backward_cond")
    iteration = names("t")
    reads = [Node("Sub", [last, step], [iteration], name=iteration, opset=13),
             Node("Identity", [iteration], [own[0]], name=own[0], opset=13),
             Node("Identity", [keep_going], [own[1]], name=own[1], opset=13)]
    for source, target in zip([*recorded, *scan_grads], [*own[2:], *element_grads]):
        reads.append(Node("Gather", [source, iteration], [target], name=target, opset=13,
                          attributes={"axis": 0}))
    sums_in = [names(f"sum_d_{name}") for name in captured]
    sums_out = [names(f"{total}_next") for total in sums_in]
    adds = [Node("Add", [total, grads[name]], [summed], name=summed, opset=13)
            for name, total, summed in zip(captured, sums_in, sums_out)]
    cond_out = names("backward_cond_out")
    backward.nodes = [*reads, *backward.nodes, *adds,
                      Node("Identity", [keep_going], [cond_out], name=cond_out, opset=13)]
    backward.inputs = [Value(step, TensorType(np.dtype(np.int64), ())),
                       Value(keep_going, TensorType(np.dtype(bool), ())),
                       *(Value(grad, body.inputs[2 + k].type)
                         for grad, k in zip(state_grads, float_states)),
                       *(Value(total, b.types.get(c)) for total, c in zip(sums_in, captured))]
    backward.outputs = [Value(cond_out, TensorType(np.dtype(bool), ())),
                        *(Value(grads[own[2 + k]], body.inputs[2 + k].type)
                          for k in float_states),
                        *(Value(summed, b.types.get(c)) for summed, c in zip(sums_out, captured))]
    backward.name = b.fresh(f"{node.label}_body_grad")
    _finish(backward, b.fresh)
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
