"""Band fusion (opt_level 2): ``Conv/FusedConv [-> LRN] -> MaxPool/AveragePool`` becomes
``mixrt::FusedConvPool``, which computes the pooled output a band of rows at a time
(``ops/conv/fused_conv_pool.py``), so the conv's output, usually a CNN's largest tensor, never
takes room in the arena.

It runs after ``fuse_products``: the conv has already absorbed its bias and activation (a
residual add stops it: a residual is a whole tensor anyway). A chain is fused only when

* the conv is 2-D with a 4-D input of known channels and spatial size, in float32/float64,
  and its output takes at least :data:`MIN_BYTES` per image (small ones gain nothing: their
  bands would be one band, and the arena peak lies elsewhere);
* each value between the ops has that one reader and is not a graph output;
* the pool is 2-D, with no Indices output, no dilation, explicit (or VALID) pads, and is
  not an AveragePool that counts padding in ceil_mode (a band cannot tell the declared
  pads from the overhang there);
* the tensors it never makes are what sets the graph's peak: without them the largest
  total of tensors alive at one step falls by at least :data:`PEAK_GAIN`. Bands cost time
  (Python threads, a conv setup and a pool call per band): against the unfused conv and
  pool, in one process alternating, SqueezeNet's stem ran 1.41x on two threads, ShuffleNet's
  1.15x, ResNet-50's 1.11x, Inception-v2's second conv 1.12x. And on ResNet-50, DenseNet-121
  and ShuffleNet they saved no arena at all, whose peak lies in later stages.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.conv.windows import CONV_ATTRIBUTES
from mixrt.ops.conv.fused_conv_pool import POOLS
from mixrt.ops.ir.registry import MIXRT
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.fuse import FLOAT_DTYPES
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import dtype_of, kernel_for, read_counts, remove_nodes

# the conv output per image from which a chain is banded: ZFNet-512's first (4.35 MiB),
# ResNet-50's stem (3.06 MiB), AlexNet's first (1.07 MiB)
MIN_BYTES = 1 << 20
# the share of the graph's peak (the largest total of tensors alive at one step) a chain's
# bands must save: with bands the arenas of the light zoo went AlexNet 1.32 -> 0.91 MiB,
# Inception-v1 3.80 -> 2.67, Inception-v2 3.83 -> 2.01, VGG-19 24.5 -> 15.3, ZFNet-512
# 4.96 -> 1.68, SqueezeNet 3.19 -> 2.95 (7.5%, under this: its stem stays unfused)
PEAK_GAIN = 1 / 8
_CONV_ATTRIBUTES = CONV_ATTRIBUTES + ("activation", "activation_params")


def fuse_conv_pools(graph: Graph, ir_version: int | None) -> int:
    """Fuse every conv -> [LRN] -> pool chain that qualifies; returns how many."""
    types = infer_types(graph)
    counts = read_counts(graph)
    readers = {n: node for node in graph.nodes for n in node.inputs if n}
    chains = []
    for conv in graph.nodes:
        chain = _chain(graph, conv, types, counts, readers)
        if chain is not None:
            chains.append((conv, *chain))
    chosen = _lowering_the_peak(graph, types, chains)
    for conv, lrn, pool in chosen:
        _replace(graph, conv, lrn, pool)
    if chosen:
        graph.opsets.setdefault(MIXRT, 1)
    return len(chosen)


def _lowering_the_peak(graph: Graph, types: dict, chains: list) -> list:
    """The chains to band: none unless banding them all lowers the peak by PEAK_GAIN; then
    all but those whose tensors, made after all, leave that lower peak where it is. (Each
    one alone may gain nothing: Inception-v2's two stem convs make 3.2 MB each, one after
    the other, and only banding both lowers its peak.)"""
    live = _live_bytes(graph, types)
    banded = list(chains)
    lowest = _without(live, graph, types, banded)
    if not chains or max(lowest) > max(live) * (1 - PEAK_GAIN):
        return []
    for chain in chains:
        others = [c for c in banded if c is not chain]
        if max(_without(live, graph, types, others)) <= max(lowest):
            banded = others
    return banded


def _live_bytes(graph: Graph, types: dict) -> list[int]:
    """Bytes per image of the arena's tensors alive at each node, as the planner will see
    them: each value a node makes, from that node to its last reader (feeds, weights and
    graph outputs stay outside the arena; tensors of unknown shape are not counted). A pool
    whose input dies there writes over it (the planner's shrinking in-place pair), so its
    output counts from the next node on."""
    steps = len(graph.nodes)
    last = {name: step for step, node in enumerate(graph.nodes) for name in node.inputs
            if name}
    outputs = set(graph.output_names)
    live = [0] * steps
    for step, node in enumerate(graph.nodes):
        over_input = node.op_type in POOLS and not node.domain and bool(node.inputs) \
            and last.get(node.inputs[0]) == step
        for name in node.outputs:
            if not name or name in outputs:
                continue
            size = _bytes_per_image(types.get(name))
            for alive in range(step + over_input, last.get(name, step) + 1):
                live[alive] += size
    return live


def _without(live: list[int], graph: Graph, types: dict, chains) -> list[int]:
    """``live`` without the tensors the ``chains``' bands never make: each conv's output
    (and its LRN's), alive from the conv to the pool."""
    live = list(live)
    for conv, lrn, pool in chains:
        start, stop = graph.nodes.index(conv), graph.nodes.index(pool)
        size = sum(_bytes_per_image(types.get(node.outputs[0]))
                   for node in (conv, lrn) if node is not None)
        for step in range(start, stop + 1):
            live[step] -= size
    return live


def _bytes_per_image(value_type) -> int:
    shape, dtype = getattr(value_type, "shape", None), dtype_of(value_type)
    if shape is None or dtype is None or len(shape) == 0:
        return 0
    dims = [d for d in shape[1:] if isinstance(d, (int, np.integer))]
    if len(dims) != len(shape) - 1:
        return 0
    return math.prod(dims) * dtype.itemsize


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
