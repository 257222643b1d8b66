"""float16 graphs computed in float32 (opt_level 2).

Converters such as onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``
turn a float32 model into float16 weights and values, with a Cast to float16 after each
float32 input and a Cast back before each float32 output. On a CPU, NumPy has no float16
arithmetic of its own (every product and sum goes through conversions element by element)
and the compiled kernels serve float32 only, so such a model ran some thirty times slower
than its float32 original.

This pass computes every float16 value of the graph in float32 instead:

* float16 constants (initializers, Constant/ConstantOfShape values) are converted once, at
  load;
* a Cast to float16 becomes a Cast to float32, and a Cast that now converts float32 to
  float32 (the pairs around each op or region) is removed;
* a float16 graph input is cast to float32 where it enters; a float16 graph output is
  computed in float32 and rounded to float16 by one Cast at the end, so no output's dtype
  ever changes.

Why it is sound: each float16 value is a float32 value too, and float32 arithmetic on the
same operands is at least as accurate as float16 arithmetic (which rounds every intermediate
to 11 significant bits and overflows past 65504). What changes is only that intermediate
values are no longer rounded to float16, so outputs move by at most the float16 rounding
the graph did along the way, which is the tolerance a float16 model is held to anyway;
onnxruntime's CPU provider does the same for ops it has no float16 kernel for (it inserts
casts to float around them).

The pass applies to the outermost graph only and only when every node that reads or writes
a float16 value is an op whose meaning does not depend on its dtype (arithmetic, products,
normalizations, pools, shape and indexing ops); anything else (a subgraph reading float16
values, an op that reinterprets bits, a random generator with a dtype attribute) leaves the
graph untouched, so the result is the graph as written or wholly float32 inside.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, node_reads
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (NameMaker, dtype_of, overridable_initializers,
                                          remove_nodes, rename_output, replace_reads)

_FLOAT, _FLOAT16 = 1, 10  # ONNX TensorProto data types
_HALF, _SINGLE = np.dtype(np.float16), np.dtype(np.float32)

# ops whose result for float32 operands is their float16 result computed without
# intermediate rounding: nothing in them depends on the width of the float type
_DTYPE_GENERIC = frozenset("""
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
    Ceil Celu Clip Concat Conv ConvTranspose Cos Cosh CumSum DepthToSpace Div Dropout Einsum
    Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gelu Gemm
    GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization HardSigmoid
    HardSwish Identity InstanceNormalization LRN LayerNormalization LeakyRelu Less
    LessOrEqual Log LogSoftmax MatMul Max MaxPool Mean Min Mish Mul Neg Not Or PRelu Pad Pow
    Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
    ReduceSum ReduceSumSquare Relu Reshape Resize Round Selu Shape Sigmoid Sign Sin Sinh Size
    Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh
    ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())


def compute_half_in_float(graph: Graph, ir_version: int | None) -> int:
    """Rewrite a float16 graph to compute in float32; returns how many float16 values (and
    constants) became float32, 0 when the graph is left as it was."""
    types = infer_types(graph)
    half = {name for name, t in types.items() if dtype_of(t) == _HALF}
    if not half or not _convertible(graph, half):
        return 0
    overridable = overridable_initializers(graph, ir_version)
    for name in [n for n in graph.initializers if n in half and n not in overridable]:
        graph.initializers[name] = graph.initializers[name].astype(_SINGLE)
    for node in graph.nodes:
        _widen_node(node)
    for name in half:
        if name in graph.value_types:
            graph.value_types[name] = _as_single(graph.value_types[name])
    _remove_identity_casts(graph, half, types)
    names = NameMaker(graph)
    _widen_inputs(graph, half, overridable, names)
    _round_outputs(graph, half, names)
    return len(half)


def _convertible(graph: Graph, half: set) -> bool:
    for node in graph.nodes:
        touches = any(n in half for n in node_reads(node)) or \
            any(n in half for n in node.outputs)
        if touches and not _generic(node):
            return False
    return True


def _generic(node: Node) -> bool:
    if node.domain or node.subgraphs():
        return False
    if node.op_type == "Cast":
        return node.attributes.get("to") in (_FLOAT, _FLOAT16)
    if node.op_type in ("Constant", "ConstantOfShape"):
        return set(node.attributes) <= {"value"} and \
            all(isinstance(v, np.ndarray) for v in node.attributes.values())
    return node.op_type in _DTYPE_GENERIC


def _widen_node(node: Node) -> None:
    if node.op_type == "Cast" and node.attributes.get("to") == _FLOAT16:
        node.attributes = dict(node.attributes, to=_FLOAT)
    value = node.attributes.get("value")
    if node.op_type in ("Constant", "ConstantOfShape") and isinstance(value, np.ndarray) \
            and value.dtype == _HALF:
        node.attributes = dict(node.attributes, value=value.astype(_SINGLE))


def _as_single(value_type):
    if isinstance(value_type, TensorType) and np.dtype(value_type.dtype) == _HALF:
        return value_type.with_dtype(_SINGLE)
    return value_type


def _remove_identity_casts(graph: Graph, half: set, types: dict) -> None:
    """Casts to float32 of what is now float32 (a float32 input's Cast to float16 widened,
    or a float16 value's Cast back) pass their input through."""
    outputs, inputs = set(graph.output_names), set(graph.input_names)
    for node in list(graph.nodes):
        if node.op_type != "Cast" or node.attributes.get("to") != _FLOAT:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x not in half and dtype_of(types.get(x)) != _SINGLE:
            continue
        if y not in outputs:
            remove_nodes(graph, [node])
            replace_reads(graph, y, x)
            continue
        producer = next((n for n in graph.nodes if x in n.outputs), None)
        if producer is not None and x not in outputs and x not in inputs:
            remove_nodes(graph, [node])
            rename_output(graph, producer, x, y)
            half.discard(x)


def _widen_inputs(graph: Graph, half: set, overridable: set, names) -> None:
    """Each float16 input (or overridable float16 initializer) is read through a Cast."""
    casts = []
    for name in [v.name for v in graph.inputs if v.name in half]:
        if name in graph.initializers and name not in overridable:
            continue
        widened = names(f"{name}_float")
        replace_reads(graph, name, widened)
        casts.append(Node("Cast", [name], [widened], name=widened, opset=_cast_opset(graph),
                          attributes={"to": _FLOAT}))
    graph.nodes[:0] = casts


def _round_outputs(graph: Graph, half: set, names) -> None:
    """Each float16 output is computed in float32 under a new name, then rounded by a Cast."""
    producers = graph.producers()
    for value in graph.outputs:
        producer = producers.get(value.name)
        if value.name not in half or producer is None:
            continue  # an input passed straight through keeps its float16 feed
        computed = names(f"{value.name}_float")
        rename_output(graph, producer, value.name, computed)
        graph.nodes.append(Node("Cast", [computed], [value.name], name=value.name,
                                opset=_cast_opset(graph), attributes={"to": _FLOAT16}))


def _cast_opset(graph: Graph) -> int:
    return max(int(graph.opsets.get("", 13)), 13)
