import numpy as np
import pytest

from mixrt.errors import UnsupportedOperatorError
from mixrt.ops import REGISTRY
from mixrt.ops.ir.registry import Registry, op


def test_at_least_150_onnx_operators():
    default_domain = {name for domain, name in REGISTRY.op_names() if domain == ""}
    assert len(default_domain) >= 150, len(default_domain)


def test_transformer_encoder_ops_are_registered():
    needed = ["MatMul", "Gemm", "Softmax", "LayerNormalization", "Erf", "Gelu", "Where",
              "Gather", "Expand", "Slice", "Split", "Concat", "Transpose", "Reshape",
              "Squeeze", "Unsqueeze", "Cast", "Range", "Shape", "ConstantOfShape", "ReduceMean",
              "ReduceSum", "Pow", "Sqrt", "Tanh", "Sigmoid", "Einsum", "If", "Loop"]
    missing = [name for name in needed if not REGISTRY.has_op("", name)]
    assert not missing


def test_every_kernel_has_shape_inference():
    missing = [f"{k.domain or 'ai.onnx'}::{k.op_type}@{k.since}" for k in REGISTRY.all_kernels()
               if k.infer_fn is None]
    assert not missing


def test_versions_chain_without_gaps():
    for domain, name in REGISTRY.op_names():
        versions = REGISTRY.versions(domain, name)
        for current, following in zip(versions, versions[1:]):
            assert current.until == following.since - 1
        assert versions[-1].until is None


def test_lookup_error_lists_ranges_and_dtypes():
    registry = Registry()
    handle = op("Twice", since=7, dtypes=frozenset({"float32"}))(lambda xp, x: x * 2)
    registry.add(handle.kernels[0])
    with pytest.raises(UnsupportedOperatorError, match=r"node 'n1'.*opset 6.*ranges: 7\+"):
        registry.lookup("", "Twice", 6, node="n1")
    with pytest.raises(UnsupportedOperatorError, match=r"dtype int8.*implemented dtypes: float32"):
        registry.lookup("", "Twice", 9, node="n1", dtype="int8")
    with pytest.raises(UnsupportedOperatorError) as info:
        registry.lookup("ai.onnx", "Nope", 9, node="n2", dtype="float32", device="cpu")
    assert (info.value.node, info.value.op_type, info.value.opset) == ("n2", "Nope", 9)


def test_one_kernel_serves_numpy_generically():
    kernel = REGISTRY.find("", "Add", 14)
    out = kernel.fn(np, np.array([1, 2]), np.array([3, 4]))
    np.testing.assert_array_equal(out, [4, 6])
