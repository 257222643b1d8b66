"""A Scan that computes distances row by row, as skl2onnx writes scikit-learn's
nearest-neighbours models (its ``onnx_cdist``), replaced by one
``mixrt::PairwiseSquaredDistances`` node (opt_level 2; the op: ``ops/ml/distances.py``)::

    Scan(X, R), one state and one scan input, body:
        state_out = Identity(state_in)
        d = Sub(state_in, r) or Sub(r, state_in)
        s = ReduceSumSquare(d, axes=[1], keepdims=0) (axes as an input from opset 18)
        out = s, Identity(s) or Sqrt(s)

Its outputs are the state (X unchanged) and the stacked step outputs [T, N]. The state
output becomes an Identity of X where anything reads it. Scan-8 (with its batch axis) and
scans with non-default axes or directions are left alone.
"""

from __future__ import annotations

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.rewrite import constant_scopes, kernel_for, read_counts

_DEFAULT_ATTRIBUTES = {"body", "num_scan_inputs"}


def fuse_scan_distances(graph: Graph, ir_version: int | None) -> int:
    """Replace each distance Scan by one node; returns how many."""
    fused = 0
    for g, constants in constant_scopes(graph, ir_version):
        counts = read_counts(g)
        rewritten = []
        for node in g.nodes:
            replacement = _replacement(node, constants)
            if replacement is None:
                rewritten.append(node)
                continue
            state_out = node.outputs[0]
            if state_out and counts[state_out]:  # graph outputs are counted as reads
                rewritten.append(Node("Identity", [node.inputs[0]], [state_out],
                                      f"{node.name}/state", "", graph.opsets.get("", 1), {}))
            rewritten.append(replacement)
            fused += 1
        g.nodes = rewritten
    return fused


def _replacement(scan: Node, constants: dict) -> Node | None:
    root = _distance_body(scan, constants)
    if root is None:
        return None
    fused = Node("PairwiseSquaredDistances", [scan.inputs[0], scan.inputs[1]],
                 [scan.outputs[1]], scan.name, "mixrt", 1, {"root": int(root)})
    return fused if kernel_for(fused) is not None else None


def _distance_body(scan: Node, constants: dict) -> bool | None:
    """For a distance Scan, whether its steps take the square root; None otherwise."""
    if scan.op_type != "Scan" or scan.domain or scan.opset < 9:
        return None
    if set(scan.attributes) - _DEFAULT_ATTRIBUTES or scan.attributes.get("num_scan_inputs") != 1:
        return None
    if len(scan.inputs) != 2 or len(scan.outputs) != 2 or not scan.outputs[1]:
        return None
    body = scan.attributes["body"]
    if len(body.inputs) != 2 or len(body.outputs) != 2:
        return None
    state_in, row = (value.name for value in body.inputs)
    state_out, step_out = body.output_names
    producers = {name: node for node in body.nodes for name in node.outputs}
    identity = producers.get(state_out)
    if not _plain(identity, "Identity") or identity.inputs != [state_in]:
        return None
    root, last = False, producers.get(step_out)
    if _plain(last, "Identity", "Sqrt"):
        root = last.op_type == "Sqrt"
        last = producers.get(last.inputs[0])
    known = {**constants, **body.initializers}
    if not _sum_of_squares_over_columns(last, known):
        return None
    difference = producers.get(last.inputs[0])
    if not _plain(difference, "Sub") or sorted(difference.inputs) != sorted([state_in, row]):
        return None
    used = {id(n) for n in (identity, difference, last, producers.get(step_out))}
    return root if len(used) == len(body.nodes) else None


def _sum_of_squares_over_columns(node: Node | None, constants: dict) -> bool:
    if not _plain(node, "ReduceSumSquare") or node.attributes.get("keepdims", 1) != 0:
        return False
    axes = node.attributes.get("axes")
    if len(node.inputs) == 2 and axes is None:
        found = constants.get(node.inputs[1])
        axes = None if found is None else [int(a) for a in found.reshape(-1)]
    elif len(node.inputs) != 1:
        return False
    return axes is not None and list(axes) in ([1], [-1])


def _plain(node: Node | None, *op_types: str) -> bool:
    return node is not None and not node.domain and node.op_type in op_types
