"""Convolution taps that only ever read padding, dropped from the kernel.

A dilated convolution over a small image can have taps that, at every output position, land
in the zero padding: DeepLabV3's atrous pyramid runs 3x3 kernels with dilation 12, 24 and 36
over a 14x14 map, where at dilation 24 and 36 only the centre tap ever reads the image. Those
taps add nothing but time (the dilation-36 layer was a quarter of the model's run). With the
input's spatial shape static, each spatial axis keeps the contiguous range of taps that
reach the image, and the pads shrink so every kept tap reads what it read before and the
output keeps its shape; a 3x3 kernel left with its centre is a 1x1 convolution.

Exact but for summation order: a dropped tap multiplied zeros, unless its weight is not
finite (0 * inf is NaN), and then the node is left as it is. Conv nodes of the default
domain with an explicit (or no) padding and a constant weight only; opt_level 2.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import NameMaker, constant_scopes, static_shape


def drop_dead_conv_taps(graph: Graph, ir_version: int | None) -> int:
    """Trim every Conv kernel to the taps that read its input; returns how many Convs."""
    types = infer_types(graph)
    names = NameMaker(graph)
    trimmed = 0
    for g, constants in constant_scopes(graph, ir_version):
        for node in g.nodes:
            if not _plain_conv(node):
                continue
            weight, shape = constants.get(node.inputs[1]), static_shape(types.get(node.inputs[0]))
            if weight is None or shape is None or len(shape) != weight.ndim:
                continue
            geometry = _geometry(node, shape[2:], weight.shape[2:])
            kept = None if geometry is None else _live_taps(geometry)
            if kept is not None and _trim(g, node, weight, geometry, kept, names, constants):
                trimmed += 1
    return trimmed


def _plain_conv(node: Node) -> bool:
    return node.op_type == "Conv" and not node.domain and len(node.inputs) >= 2 \
        and node.attributes.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")


def _geometry(node: Node, image: tuple, kernel: tuple) -> list[dict] | None:
    """Per spatial axis: the image size, taps, stride, dilation, pads and output count;
    None where the attributes are not what this pass reads or an axis has no output."""
    axes = len(kernel)
    strides = list(node.attributes.get("strides") or [1] * axes)
    dilations = list(node.attributes.get("dilations") or [1] * axes)
    pads = list(node.attributes.get("pads") or [0] * (2 * axes))
    if len(strides) != axes or len(dilations) != axes or len(pads) != 2 * axes:
        return None
    geometry = []
    for axis in range(axes):
        size, taps, stride, dilation = image[axis], kernel[axis], strides[axis], dilations[axis]
        begin, end = pads[axis], pads[axis + axes]
        outputs = (size + begin + end - dilation * (taps - 1) - 1) // stride + 1
        if outputs < 1 or size < 1:
            return None
        geometry.append(dict(size=size, taps=taps, stride=stride, dilation=dilation,
                             begin=begin, outputs=outputs))
    return geometry


def _live_taps(geometry: list[dict]) -> list[tuple[int, int]] | None:
    """Per spatial axis, the first and last tap that reads the image at some output
    position; None when every tap does."""
    kept = []
    for axis in geometry:
        read = np.arange(axis["outputs"])[:, None] * axis["stride"] - axis["begin"] \
            + np.arange(axis["taps"])[None, :] * axis["dilation"]
        live = np.flatnonzero(((read >= 0) & (read < axis["size"])).any(axis=0))
        if not len(live):
            return None  # an output that reads only padding: leave such oddities alone
        kept.append((int(live[0]), int(live[-1])))
    if all(first == 0 and last == axis["taps"] - 1
           for (first, last), axis in zip(kept, geometry)):
        return None
    return kept


def _trim(g: Graph, node: Node, weight: np.ndarray, geometry: list[dict], kept: list,
          names: NameMaker, constants: dict) -> bool:
    """Rewrite ``node`` to the ``kept`` taps; False (node untouched) where the dropped
    weights are not all finite or the pads cannot be made non-negative."""
    axes = len(kept)
    window = tuple(slice(first, last + 1) for first, last in kept)
    trimmed = weight[(slice(None), slice(None)) + window]
    dropped = np.ones(weight.shape[2:], dtype=bool)
    dropped[window] = False
    if not np.isfinite(weight[..., dropped]).all():
        return False
    new_pads = [0] * (2 * axes)
    for index, ((first, last), axis) in enumerate(zip(kept, geometry)):
        begin = axis["begin"] - first * axis["dilation"]
        end = (axis["outputs"] - 1) * axis["stride"] + axis["dilation"] * (last - first) + 1 \
            - axis["size"] - begin
        if begin < 0 or end < 0:
            return False
        new_pads[index], new_pads[index + axes] = begin, end
    name = names(f"{node.inputs[1]}_live_taps")
    g.initializers[name] = constants[name] = np.ascontiguousarray(trimmed)
    node.inputs = [node.inputs[0], name, *node.inputs[2:]]
    # an axis left with one tap has no use for its dilation; 1 lets a 1x1 kernel take the
    # pointwise convolution's path
    dilations = [1 if taps == 1 else axis["dilation"]
                 for taps, axis in zip(trimmed.shape[2:], geometry)]
    node.attributes = {**node.attributes, "pads": new_pads, "dilations": dilations,
                       "kernel_shape": list(trimmed.shape[2:])}
    return True
