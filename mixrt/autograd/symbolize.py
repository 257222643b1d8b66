"""MXNet's ``autograd.get_symbol``: the recorded computation of an array as a Symbol.

The tape already holds the graph: each recorded op call is a node with its op, attributes
and where each input came from. Walking it back from the array in recording order gives a
symbol with one node per call; the arrays with a gradient attached become Variables
(``var0``, ``var1``, ... in the order first read, as MXNet names them) and inputs that
came from outside the recording become constants. A Python ``autograd.Function`` or custom
operator has no op to put in a graph, so a recording through one is refused.
"""

from __future__ import annotations

from mixrt import sym
from mixrt.base.errors import GradientError
from mixrt.sym.symbol import call_op
from mixrt.tape import nodes


def get_symbol(array) -> "sym.Symbol":
    """The recorded computation of ``array`` as a Symbol."""
    if getattr(array, "_entry", None) is None:
        if getattr(array, "_grad", None) is not None:
            return sym.Variable("var0")
        raise GradientError("get_symbol: the array was not computed under "
                            "autograd.record() from an array with a gradient attached")
    built: dict = {}
    variables: dict = {}
    for node in sorted(nodes._nodes_behind([array]), key=lambda n: n.seq):
        built[id(node)] = _node_symbol(node, built, variables, len(built))
    node, index = array._entry
    return built[id(node)][index]


def _node_symbol(node, built: dict, variables: dict, position: int):
    if not isinstance(node, nodes.OpNode):
        raise GradientError(f"get_symbol: the recording passes through {node.name}, Python "
                            f"code with no operator to put in a symbol")
    if node.freed:
        raise GradientError(f"get_symbol: backward() freed the recording of {node.name}; "
                            f"record again, or pass retain_graph=True to backward")
    inputs = [_input(parent, raw, built, variables)
              for parent, raw in zip(node.parents, node.xs)]
    result = call_op(node.spec.domain, node.spec.op_type, inputs, dict(node.attributes),
                     name=f"node_{position}", num_outputs=len(node.out_meta))
    return [result[i] for i in range(len(node.out_meta))] if len(node.out_meta) > 1 \
        else [result]


def _input(parent, raw, built: dict, variables: dict):
    if raw is None:
        return None  # a missing optional input
    if isinstance(parent, tuple):
        node, index = parent
        return built[id(node)][index]
    if parent is not None:  # a leaf with a gradient attached
        if id(parent) not in variables:
            variables[id(parent)] = sym.Variable(f"var{len(variables)}")
        return variables[id(parent)]
    return sym.constant(raw.get() if hasattr(raw, "get") else raw)
