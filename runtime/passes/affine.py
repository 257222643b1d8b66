"""Per-channel affine maps folded into weights (opt_level 2; rounding may change).

* A Conv whose only reader is an inference BatchNormalization, or a Mul/Add/Sub/Div by a
  per-output-channel constant, absorbs it: ``W' = W * s`` (per output channel, so grouped
  convolutions need nothing special) and ``B' = B * s + t``. Inception v2 and ResNet-50
  lose every BatchNormalization this way.
* A BatchNormalization left over (after a Concat in DenseNet, say) becomes ``x * s + t``,
  two elementwise nodes the elementwise fuser can join with what follows.
* A run of Mul/Add/Sub/Div by constants collapses to at most one Mul and one Add.

Folded constants are computed in float64 and rounded once to the weight's dtype.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.types import broadcast_or_none
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (NameMaker, constant_scopes, default_opset, dtype_of,
                                          kernel_for, read_counts, remove_nodes)

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_AFFINE_OPS = ("Mul", "Add", "Sub", "Div")


# -- BatchNormalization as scale and shift -----------------------------------------------------

def batchnorm_affine(node: Node, constants: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(s, t) with BN(x) = x * s + t per channel, for an inference BN with constant
    parameters; None for anything else (training mode, spatial=0, unknown parameters)."""
    if node.op_type != "BatchNormalization" or node.domain != "" or kernel_for(node) is None:
        return None
    if node.opset < 14 and len(node.outputs) != 1:  # asking for statistics means training
        return None
    if node.attributes.get("training_mode", 0) or not node.attributes.get("spatial", 1):
        return None
    if any(o for o in node.outputs[1:]) or len(node.inputs) != 5:
        return None
    params = [constants.get(name) for name in node.inputs[1:]]
    if any(p is None for p in params) or len({p.size for p in params}) != 1:
        return None
    scale, bias, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    s = scale / np.sqrt(var + float(node.attributes.get("epsilon", 1e-5)))
    return s, bias - mean * s


# -- Conv absorbing the affine map that follows it ----------------------------------------------

def fold_conv_affine(graph: Graph, ir_version: int | None) -> int:
    """Fold BN / constant Mul, Add, Sub, Div that follow a Conv into its W and B."""
    folded = 0
    names = NameMaker(graph)
    for g, constants in constant_scopes(graph, ir_version):
        while True:
            done = _fold_conv_affine_once(g, constants, names)
            if not done:
                break
            folded += done
    return folded


def _fold_conv_affine_once(g: Graph, constants: dict, names: NameMaker) -> int:
    counts, folded = read_counts(g), 0
    readers = {n: node for node in g.nodes for n in node.inputs if n}
    for conv in list(g.nodes):
        if conv.op_type != "Conv" or conv.domain != "" or len(conv.outputs) != 1:
            continue
        weights = _conv_weights(conv, constants)
        y = conv.outputs[0]
        if weights is None or counts[y] != 1 or y in g.output_names or y not in readers:
            continue
        follower = readers[y]
        affine = _channel_affine(follower, y, constants, weights[0])
        if affine is None:
            continue
        _absorb(g, conv, follower, weights, affine, constants, names)
        folded += 1
        counts = read_counts(g)
        readers = {n: node for node in g.nodes for n in node.inputs if n}
    return folded


def _conv_weights(conv: Node, constants: dict):
    """(W, B or None) when both are constants of a fusable float dtype."""
    if len(conv.inputs) < 2 or conv.inputs[1] not in constants:
        return None
    W = constants[conv.inputs[1]]
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    if bias_name and bias_name not in constants:
        return None
    B = constants[bias_name] if bias_name else None
    if W.dtype not in FLOAT_DTYPES or W.ndim < 3 or B is not None and B.size != W.shape[0]:
        return None  # a mismatched bias fails at run time; leave that error alone
    return W, B


def _channel_affine(node: Node, y: str, constants: dict, W: np.ndarray):
    """(scale or None, shift or None), each a float64 vector over W's output channels, when
    ``node`` maps ``y`` per channel by constants; else None."""
    channels, rank = W.shape[0], W.ndim
    if node.op_type == "BatchNormalization":
        if node.inputs[0] != y:
            return None
        affine = batchnorm_affine(node, constants)
        if affine is None or affine[0].size not in (1, channels):
            return None
        return tuple(np.broadcast_to(v, (channels,)) for v in affine)
    if node.op_type not in _AFFINE_OPS or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.opset < 7 or kernel_for(node) is None:  # legacy broadcast forms stay
        return None
    other = _other_operand(node, y)
    if other is None or other not in constants or constants[other].dtype != W.dtype:
        return None
    vector = _per_channel(constants[other], rank, channels)
    if vector is None:
        return None
    return {"Mul": (vector, None), "Div": (1.0 / vector, None),
            "Add": (None, vector), "Sub": (None, -vector)}[node.op_type]


def _other_operand(node: Node, y: str) -> str | None:
    """The constant side of ``y op c``; Sub and Div only with ``y`` first."""
    a, b = node.inputs
    if a == y and b != y:
        return b
    if b == y and a != y and node.op_type in ("Mul", "Add"):
        return a
    return None


def _per_channel(c: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a float64 vector over axis 1 of a rank-``rank`` tensor, when it broadcasts
    along that axis only (and so leaves the tensor's shape unchanged)."""
    if c.ndim > rank:
        return None
    dims = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(dims) if i != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(np.asarray(c, np.float64).reshape(-1), (channels,))


def _absorb(g, conv, follower, weights, affine, constants, names) -> None:
    W, B = weights
    scale, shift = affine
    w = W.copy() if scale is None else _scaled_filters(W, scale)  # an array of its own
    b = np.zeros(W.shape[0]) if B is None else B.astype(np.float64).reshape(-1)
    if scale is not None:
        b = b * scale
    if shift is not None:
        b = b + shift
    out = follower.outputs[0]
    w_name, b_name = names(f"{out}_folded_W"), names(f"{out}_folded_B")
    g.initializers[w_name] = constants[w_name] = w
    g.initializers[b_name] = constants[b_name] = b.astype(W.dtype)
    conv.inputs = [conv.inputs[0], w_name, b_name]
    conv.outputs = [out]
    remove_nodes(g, [follower])


def _scaled_filters(W: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``W * scale`` per output channel, each product taken in float64 and rounded once to
    ``W``'s dtype. One ufunc call that casts in its own small buffers: the whole filter bank
    in float64 and back (ResNet-50: 100 MB of float32 made 200 MB twice) took 3x as long."""
    out = np.empty_like(W)
    np.multiply(W, scale.reshape((-1,) + (1,) * (W.ndim - 1)), out=out, casting="unsafe")
    return out


# -- BatchNormalization as Mul and Add ------------------------------------------------------------

def batchnorm_to_affine(graph: Graph, ir_version: int | None) -> int:
    """Rewrite each remaining inference BN with constant parameters as ``x * s + t``."""
    types = infer_types(graph)
    names = NameMaker(graph)
    rewritten = 0
    for g, constants in constant_scopes(graph, ir_version):
        for node in list(g.nodes):
            affine = batchnorm_affine(node, constants)
            x_type = types.get(node.inputs[0]) if node.inputs else None
            if affine is None or not _fits_channels(x_type, affine[0].size):
                continue
            _replace_with_affine(g, node, affine, x_type.rank, dtype_of(x_type), names)
            rewritten += 1
    return rewritten


def _fits_channels(x_type, channels: int) -> bool:
    """x is a float (N, C, ...) tensor whose C, when known, matches the parameters."""
    shape = getattr(x_type, "shape", None)
    if shape is None or len(shape) < 2 or dtype_of(x_type) not in FLOAT_DTYPES:
        return False
    return not isinstance(shape[1], int) or shape[1] == channels


def _replace_with_affine(g, node, affine, rank, dtype, names) -> None:
    shape = (-1,) + (1,) * (rank - 2)
    y = node.outputs[0]
    s_name, t_name, scaled = names(f"{y}_bn_scale"), names(f"{y}_bn_shift"), names(f"{y}_bn_x")
    g.initializers[s_name] = affine[0].reshape(shape).astype(dtype)
    g.initializers[t_name] = affine[1].reshape(shape).astype(dtype)
    opset = default_opset(g)
    mul = Node("Mul", [node.inputs[0], s_name], [scaled], f"{node.name}_scale" if node.name
               else "", "", opset)
    add = Node("Add", [scaled, t_name], [y], node.name, "", opset)
    at = g.nodes.index(node)
    g.nodes[at:at + 1] = [mul, add]


# -- runs of constant Mul/Add/Sub/Div ----------------------------------------------------------

def combine_affine_chains(graph: Graph, ir_version: int | None) -> int:
    """Collapse ``((x * a + b) * c - d) / e`` to ``x * s + t``; returns nodes saved."""
    types = infer_types(graph)
    names = NameMaker(graph)
    saved = 0
    for g, constants in constant_scopes(graph, ir_version):
        counts = read_counts(g)
        readers = {n: node for node in g.nodes for n in node.inputs if n}
        taken: set[int] = set()
        for node in list(g.nodes):
            if id(node) in taken:
                continue
            chain = _affine_chain(g, node, constants, types, counts, readers)
            taken.update(id(n) for n in chain)
            if len(chain) >= 2:
                saved += _collapse(g, chain, constants, types, names)
    return saved


def _const_side(node: Node, constants: dict) -> tuple[str, np.ndarray] | None:
    """(variable input, constant) of ``x op c`` (Mul/Add either way round)."""
    if node.op_type not in _AFFINE_OPS or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.opset < 7 or node.attributes or kernel_for(node) is None:
        return None
    a, b = node.inputs
    if b in constants and a not in constants:
        return a, constants[b]
    if a in constants and b not in constants and node.op_type in ("Mul", "Add"):
        return b, constants[a]
    return None


def _affine_chain(g, start, constants, types, counts, readers) -> list[Node]:
    """``start`` and the constant affine nodes that follow it through private values, as
    long as no constant broadcasts the chain's input to a bigger shape."""
    first = _const_side(start, constants)
    if first is None:
        return []
    x_type = types.get(first[0])
    shape = getattr(x_type, "shape", None)
    if shape is None or dtype_of(x_type) not in FLOAT_DTYPES:
        return []
    chain, node = [], start
    while True:
        side = _const_side(node, constants)
        if side is None or side[1].dtype != dtype_of(x_type):
            break
        if broadcast_or_none(shape, side[1].shape) != tuple(shape):
            break
        chain.append(node)
        y = node.outputs[0]
        if counts[y] != 1 or y in g.output_names or y not in readers:
            break
        following = readers[y]
        if _const_side(following, constants) is None or _const_side(following, constants)[0] != y:
            break
        node = following
    return chain


def _collapse(g, chain, constants, types, names) -> int:
    x = _const_side(chain[0], constants)[0]
    dtype = dtype_of(types.get(x))
    scale, shift = np.float64(1.0), np.float64(0.0)
    for node in chain:
        c = np.asarray(_const_side(node, constants)[1], np.float64)
        if node.op_type == "Mul":
            scale, shift = scale * c, shift * c
        elif node.op_type == "Div":
            scale, shift = scale / c, shift / c
        else:
            shift = shift + c if node.op_type == "Add" else shift - c
    has_scale, has_shift = bool(np.any(scale != 1.0)), bool(np.any(shift != 0.0))
    if has_scale + has_shift >= len(chain):
        return 0
    y, opset = chain[-1].outputs[0], default_opset(g)
    replacement, current = [], x
    if has_scale:
        s_name = names(f"{y}_scale")
        g.initializers[s_name] = constants[s_name] = np.asarray(scale).astype(dtype)
        out = names(f"{y}_scaled") if has_shift else y
        replacement.append(Node("Mul", [current, s_name], [out], "", "", opset))
        current = out
    if has_shift:
        t_name = names(f"{y}_shift")
        g.initializers[t_name] = constants[t_name] = np.asarray(shift).astype(dtype)
        replacement.append(Node("Add", [current, t_name], [y], "", "", opset))
    if not replacement:
        replacement.append(Node("Identity", [x], [y], "", "", opset))
    at = g.nodes.index(chain[-1])
    g.nodes[at:at + 1] = replacement
    remove_nodes(g, chain[:-1])
    return len(chain) - len(replacement)
