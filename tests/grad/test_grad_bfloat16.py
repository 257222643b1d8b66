"""Gradients of a bfloat16 model (opset 22, where most float ops accept bfloat16) against the
same graph in float64 on the bfloat16-rounded inputs.

Backward nodes are emitted at BACKWARD_OPSET (17), where Sin, Cos, Softplus, Round and others
do not accept bfloat16 yet: the builder moves such a node to the first later version that
accepts its types and differs in nothing else (``typecheck.version_accepting``). Without it
the backward graphs of Sin, Cos, Sinh, Cosh, Mish (through Softplus) and Mod (through Round)
were refused by the type check."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from grad.gradcheck import assert_near_reference, gradients_in

BF16 = ml_dtypes.bfloat16
OPSET = 22
rng = np.random.default_rng(31)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


UNARY = ["Sin", "Cos", "Tan", "Sinh", "Cosh", "Softplus", "Mish", "Exp", "Tanh", "Sigmoid",
         "Relu", "Elu", "Selu", "HardSigmoid", "HardSwish", "LeakyRelu", "Erf", "Atan",
         "Asinh", "Softsign", "Abs", "Neg"]

CASES = {
    **{op: (op, [randn(3, 5)], {}, OPSET, [0]) for op in UNARY},
    "Log": ("Log", [positive(3, 5)], {}, OPSET, [0]),
    "Sqrt": ("Sqrt", [positive(3, 5)], {}, OPSET, [0]),
    "Mod": ("Mod", [randn(3, 5) * 4, positive(3, 5)], {"fmod": 1}, OPSET, [0, 1]),
    "Gelu": ("Gelu", [randn(3, 5)], {"approximate": "tanh"}, OPSET, [0]),
    "Pow": ("Pow", [positive(3, 5), randn(3, 5)], {}, OPSET, [0, 1]),
    "MatMul": ("MatMul", [randn(2, 3, 4), randn(4, 5)], {}, OPSET, [0, 1]),
    "Gemm": ("Gemm", [randn(3, 4), randn(5, 4), randn(5)], {"transB": 1}, OPSET, [0, 1, 2]),
    "Conv": ("Conv", [randn(2, 3, 6, 6), randn(4, 3, 3, 3), randn(4)],
             {"pads": [1, 1, 1, 1], "strides": [2, 1]}, OPSET, [0, 1, 2]),
    "ConvTranspose": ("ConvTranspose", [randn(1, 3, 4, 4), randn(3, 2, 3, 3)],
                      {"strides": [2, 2]}, OPSET, [0, 1]),
    "MaxPool": ("MaxPool", [rng.permutation(72).reshape(1, 2, 6, 6) * 0.1],
                {"kernel_shape": [2, 2], "strides": [2, 2]}, OPSET, [0]),
    "AveragePool": ("AveragePool", [randn(1, 2, 6, 6)],
                    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, OPSET, [0]),
    "GlobalAveragePool": ("GlobalAveragePool", [randn(2, 3, 4, 4)], {}, OPSET, [0]),
    "BatchNormalization": ("BatchNormalization",
                           [randn(4, 3, 5), positive(3), randn(3), np.zeros(3), np.ones(3)],
                           {"training_mode": 1}, OPSET, [0, 1, 2]),
    "InstanceNormalization": ("InstanceNormalization", [randn(2, 3, 8), positive(3), randn(3)],
                              {}, OPSET, [0, 1, 2]),
    "LayerNormalization": ("LayerNormalization", [randn(2, 3, 8), positive(8), randn(8)], {},
                           OPSET, [0, 1, 2]),
    "Softmax": ("Softmax", [randn(3, 6)], {}, OPSET, [0]),
    "LogSoftmax": ("LogSoftmax", [randn(3, 6)], {}, OPSET, [0]),
    "ReduceMean": ("ReduceMean", [randn(3, 6)], {}, OPSET, [0]),
    "ReduceL2": ("ReduceL2", [randn(3, 6)], {}, OPSET, [0]),
    "Transpose": ("Transpose", [randn(2, 3, 4)], {"perm": [2, 0, 1]}, OPSET, [0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bfloat16_gradients_match_float64(case):
    spec = CASES[case]
    reference = gradients_in(spec, np.float64, rounded_to=BF16)
    got = gradients_in(spec, BF16, rounded_to=BF16)
    assert all(np.asarray(g).dtype == BF16 for g in got)
    assert_near_reference(got, reference, case, tolerance=5e-2)


def test_backward_nodes_move_only_to_versions_that_change_nothing_but_types():
    """Sin's derivative is Cos: at opset 17 for float32, at 22 for bfloat16. AveragePool-19
    added dilations, so an AveragePool emitted at 17 stays there (and the type check names
    it); one emitted at 19 moves to 22. Softmax-13 kept Softmax-11's names but changed what
    axis means, and its default: the attribute defaults are part of what must match."""
    from mixrt.ops.ir.types import TensorType
    from mixrt.runtime.graph import Node
    from mixrt.runtime.passes.autodiff import BACKWARD_OPSET
    from mixrt.runtime.passes.typecheck import version_accepting

    def version(op_type, dtype, opset=BACKWARD_OPSET):
        node = Node(op_type, ["x"], ["y"], opset=opset)
        return version_accepting(node, {"x": TensorType(np.dtype(dtype), (1, 2, 3, 3))})

    assert version("Cos", np.float32) == BACKWARD_OPSET
    assert version("Cos", BF16) == 22
    assert version("AveragePool", BF16) == BACKWARD_OPSET
    assert version("AveragePool", BF16, opset=19) == 22
    assert version("Cos", np.int32) == BACKWARD_OPSET  # no version takes it
    assert version("Softmax", BF16, opset=11) == 11  # Softmax-13's axis default differs
