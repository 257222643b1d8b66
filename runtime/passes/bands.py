"""Band fusion (opt_level 2): ``Conv/FusedConv [-> LRN] -> MaxPool/AveragePool`` becomes
``mixrt::FusedConvPool``, which computes the pooled output a band of rows at a time
(``ops/fused_conv_pool.py``), so the conv's output, usually a CNN's largest tensor, never takes
room in the arena.

It runs after ``fuse_products``: the conv has already absorbed its bias and activation (a
residual add stops it: a residual is a whole tensor anyway). A chain is fused only when

* the conv is 2-D with a 4-D input of known channels and spatial size, in float32/float64,
  and its output takes at least :data:`MIN_BYTES` per image (small ones gain nothing: their
  bands would be one band, and the arena peak lies elsewhere);
* each value between the ops has that one reader and is not a graph output;
* the pool is 2-D, with no Indices output, no dilation, explicit (or VALID) pads, and is
  not an AveragePool that counts padding in ceil_mode (a band cannot tell the declared
  pads from the overhang there).
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.conv import CONV_ATTRIBUTES
from mixrt.ops.fused_conv_pool import POOLS
from mixrt.ops.fused import MIXRT
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.fuse import FLOAT_DTYPES
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import dtype_of, kernel_for, read_counts, remove_nodes

# the conv output per image from which a chain is banded: ZFNet-512's first (4.35 MiB),
# ResNet-50's stem (3.06 MiB), AlexNet's first (1.07 MiB)
MIN_BYTES = 1 << 20
_CONV_ATTRIBUTES = CONV_ATTRIBUTES + ("activation", "activation_params")


def fuse_conv_pools(graph: Graph, ir_version: int | None) -> int:
    """Fuse every conv -> [LRN] -> pool chain that qualifies; returns how many."""
    types = infer_types(graph)
    counts = read_counts(graph)
    readers = {n: node for node in graph.nodes for n in node.inputs if n}
    fused = 0
    for conv in list(graph.nodes):
        chain = _chain(graph, conv, types, counts, readers)
        if chain is not None:
            _replace(graph, conv, *chain)
            fused += 1
    if fused:
        graph.opsets.setdefault(MIXRT, 1)
    return fused


def _chain(graph: Graph, conv: Node, types: dict, counts, readers):
    """(lrn or None, pool) after ``conv`` when the three may be fused."""
    if not _is_conv(conv) or not _large_2d(types.get(conv.outputs[0]), types.get(
            conv.inputs[0])):
        return None

    def only_reader(value: str) -> Node | None:
        if counts[value] != 1 or value in graph.output_names:
            return None
        return readers.get(value)

    step = only_reader(conv.outputs[0])
    lrn = None
    if step is not None and _is_lrn(step):
        lrn, step = step, only_reader(step.outputs[0])
    if step is None or not _is_pool(step):
        return None
    return lrn, step


def _is_conv(node: Node) -> bool:
    if len(node.outputs) != 1 or kernel_for(node) is None:
        return False
    if node.domain == MIXRT and node.op_type == "FusedConv":
        return len(node.inputs) <= 3  # no residual
    return node.domain == "" and node.op_type == "Conv"


def _large_2d(y_type, x_type) -> bool:
    y_shape, x_shape = getattr(y_type, "shape", None), getattr(x_type, "shape", None)
    if y_shape is None or x_shape is None or len(y_shape) != 4 or len(x_shape) != 4:
        return False
    per_image = list(y_shape[1:]) + list(x_shape[1:])
    if not all(isinstance(d, (int, np.integer)) for d in per_image):
        return False
    dtype = dtype_of(y_type)
    return dtype in FLOAT_DTYPES and math.prod(y_shape[1:]) * dtype.itemsize >= MIN_BYTES


def _is_lrn(node: Node) -> bool:
    return (node.domain == "" and node.op_type == "LRN" and len(node.outputs) == 1
            and kernel_for(node) is not None
            and isinstance(node.attributes.get("size"), int))


def _is_pool(node: Node) -> bool:
    if node.domain != "" or node.op_type not in POOLS or kernel_for(node) is None:
        return False
    if len([n for n in node.outputs if n]) != 1 or not node.outputs[0]:
        return False  # MaxPool's Indices
    attributes = node.attributes
    kernel = attributes.get("kernel_shape")
    if kernel is None or len(kernel) != 2:
        return False
    if any(int(d) != 1 for d in attributes.get("dilations") or ()):
        return False
    if attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
        return False
    return not (node.op_type == "AveragePool" and attributes.get("count_include_pad", 0)
                and attributes.get("ceil_mode", 0))


def _replace(graph: Graph, conv: Node, lrn: Node | None, pool: Node) -> None:
    attributes = {k: v for k, v in conv.attributes.items() if k in _CONV_ATTRIBUTES}
    if lrn is not None:
        attributes.update(lrn_size=int(lrn.attributes["size"]),
                          lrn_alpha=float(lrn.attributes.get("alpha", 1e-4)),
                          lrn_beta=float(lrn.attributes.get("beta", 0.75)),
                          lrn_bias=float(lrn.attributes.get("bias", 1.0)))
    pool_attributes = pool.attributes
    valid = pool_attributes.get("auto_pad", "NOTSET") in ("VALID", b"VALID")
    attributes.update(pool=pool.op_type,
                      pool_kernel_shape=[int(k) for k in pool_attributes["kernel_shape"]],
                      pool_strides=[int(s) for s in pool_attributes.get("strides") or (1, 1)],
                      pool_pads=[0] * 4 if valid else [int(p) for p in
                                                       pool_attributes.get("pads") or (0,) * 4],
                      pool_ceil_mode=int(pool_attributes.get("ceil_mode", 0)))
    if pool.op_type == "AveragePool":
        attributes["pool_count_include_pad"] = int(pool_attributes.get("count_include_pad", 0))
    inputs = list(conv.inputs[:3])
    fused = Node("FusedConvPool", inputs, [pool.outputs[0]], conv.name, MIXRT, 1, attributes)
    graph.nodes[graph.nodes.index(pool)] = fused
    remove_nodes(graph, [conv] + ([lrn] if lrn is not None else []))
