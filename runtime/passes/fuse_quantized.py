"""Dynamically quantized linear layers fused into one ``com.microsoft`` MatMulIntegerToFloat
(opt_level 2; the op: ``ops/quant/contrib_quant_matmul.py``).

``onnxruntime.quantization.quantize_dynamic`` writes each linear layer as::

    q, a_scale, a_zero = DynamicQuantizeLinear(x)        (shared by the layers reading x)
    s = Mul(a_scale, b_scale)                            (either order)
    i = MatMulInteger(q, B, a_zero[, b_zero])
    y = Mul(Cast(i, to=FLOAT), s)                        (either order)
    [y = Add(y, bias)]                                   (either order, bias over columns)

MatMulIntegerToFloat(q, B, a_scale, b_scale, a_zero, b_zero[, bias]) computes the same
float32 operations in the same order: the exact integer sum converted to float32, times
the float32 product of the two scales, plus the bias; float multiplication and addition
are commutative, so its output equals the chain's bit for bit. One node instead of four
reads B once per session in its centered float32 form, and skips three dispatches and two
intermediate tensors per layer. Every value inside must be read only by the pattern and
must not be a graph output.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import dtype_of, read_counts, remove_nodes

COM_MICROSOFT = "com.microsoft"
_FLOAT = 1
_F32 = np.dtype(np.float32)


def fuse_dynamic_quantized_products(graph: Graph, ir_version: int | None) -> int:
    """Replace each MatMulInteger -> Cast -> Mul [-> Add] chain; returns how many."""
    del ir_version
    types = infer_types(graph)
    counts = read_counts(graph)
    producers = graph.producers()
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(node)
    fused = 0
    for product in [n for n in graph.nodes if n.op_type == "MatMulInteger" and not n.domain]:
        chain = _chain(graph, product, types, counts, producers, readers)
        if chain is not None:
            _replace(graph, product, *chain)
            fused += 1
    return fused


def _only_reader(graph, name, counts, readers, op_type):
    found = readers.get(name, [])
    if len(found) != 1 or counts[name] != 1 or name in graph.output_names:
        return None
    node = found[0]
    return node if node.op_type == op_type and not node.domain else None


def _one_value(value_type) -> bool:
    shape = getattr(value_type, "shape", None)
    return shape is not None and all(d == 1 for d in shape)


def _per_column(value_type, columns) -> bool:
    shape = getattr(value_type, "shape", None)
    return _one_value(value_type) or (shape is not None and len(shape) == 1
                                      and isinstance(columns, int) and shape[0] == columns)


def _chain(graph, product, types, counts, producers, readers):
    """(scale a, scale b, the node writing the result, bias or None), or None."""
    inputs = list(product.inputs) + [""] * (4 - len(product.inputs))
    a_zero, b_type = inputs[2], types.get(inputs[1])
    b_shape = getattr(b_type, "shape", None)
    if b_shape is None or len(b_shape) != 2 or (a_zero and not _one_value(types.get(a_zero))):
        return None
    columns = b_shape[1]
    cast = _only_reader(graph, product.outputs[0], counts, readers, "Cast")
    if cast is None or cast.attributes.get("to") != _FLOAT:
        return None
    mul = _only_reader(graph, cast.outputs[0], counts, readers, "Mul")
    if mul is None or len(mul.inputs) != 2:
        return None
    scales = _scales(mul, cast.outputs[0], types, producers, columns)
    if scales is None:
        return None
    last, bias = mul, None
    add = _only_reader(graph, mul.outputs[0], counts, readers, "Add")
    if add is not None and len(add.inputs) == 2:
        other = add.inputs[1] if add.inputs[0] == mul.outputs[0] else add.inputs[0]
        other_type = types.get(other)
        shape = getattr(other_type, "shape", None)
        if dtype_of(other_type) == _F32 and shape is not None and len(shape) == 1 \
                and isinstance(columns, int) and shape[0] == columns:
            last, bias = add, other
    return (*scales, last, bias, cast, mul)


def _scales(mul, cast_output, types, producers, columns):
    scale = mul.inputs[1] if mul.inputs[0] == cast_output else mul.inputs[0]
    if scale == cast_output:
        return None
    scales = producers.get(scale)
    if scales is None or scales.op_type != "Mul" or scales.domain or len(scales.inputs) != 2:
        return None
    first, second = scales.inputs
    if any(dtype_of(types.get(n)) != _F32 for n in (first, second)):
        return None
    for a_scale, b_scale in ((first, second), (second, first)):
        if _one_value(types.get(a_scale)) and _per_column(types.get(b_scale), columns):
            return a_scale, b_scale
    return None


def _replace(graph, product, a_scale, b_scale, last, bias, cast, mul) -> None:
    inputs = list(product.inputs) + [""] * (4 - len(product.inputs))
    q, weight, a_zero, b_zero = inputs[:4]
    fused_inputs = [q, weight, a_scale, b_scale, a_zero, b_zero, bias or ""]
    while fused_inputs and not fused_inputs[-1]:
        fused_inputs.pop()
    graph.opsets.setdefault(COM_MICROSOFT, 1)
    fused = Node("MatMulIntegerToFloat", fused_inputs, [last.outputs[0]],
                 name=product.name or last.outputs[0], domain=COM_MICROSOFT, opset=1)
    doomed = [product, cast, mul] + ([last] if last is not mul else [])
    position = graph.nodes.index(last)
    graph.nodes[position] = fused
    remove_nodes(graph, [n for n in doomed if n is not last])
    for name in (product.outputs[0], cast.outputs[0], mul.outputs[0]):
        if name != last.outputs[0]:
            graph.value_types.pop(name, None)
