"""The VNNI integer product (ops/quant/int8_cpu.py, ops/quant/_jit_int8.py): exact int32 sums
for every 8-bit dtype pair and zero-point form, ragged K, rows and columns; the float route
where it does not apply."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.quant import int8_cpu

needs_vnni = pytest.mark.skipif(not int8_cpu.available(),
                                reason="needs numba and a CPU with AVX-512 VNNI")


def _codes(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _reference(A, a_zero, B, b_zero):
    a = A.astype(np.int64) - (0 if a_zero is None else int(a_zero))
    b = B.astype(np.int64) - (0 if b_zero is None else b_zero.astype(np.int64))
    return a @ b


@needs_vnni
def test_a_product_split_with_the_native_worker_sums_what_one_thread_does(monkeypatch):
    rng = np.random.default_rng(3)
    A, B = _codes(rng, np.uint8, (37, 300)), _codes(rng, np.int8, (300, 200))
    zero = _codes(rng, np.int8, (200,))
    whole = int8_cpu.integer_product(A, np.uint8(9), B, zero, {})
    monkeypatch.setattr(int8_cpu, "SPLIT_WORK", 0)  # every product split into parts
    np.testing.assert_array_equal(int8_cpu.integer_product(A, np.uint8(9), B, zero, {}), whole)
    np.testing.assert_array_equal(whole, _reference(A, np.uint8(9), B, zero))


@needs_vnni
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("b_zero", ["none", "one", "per column"])
@pytest.mark.parametrize("shape", [(1, 4, 32), (3, 5, 7), (2, 9, 1027, 33), (64, 256, 256)])
def test_integer_products_are_exact(a_dtype, b_dtype, b_zero, shape):
    rng = np.random.default_rng(hash((a_dtype, b_dtype, b_zero, shape)) % 2**32)
    *lead, k, n = shape
    A, B = _codes(rng, a_dtype, (*lead, k)), _codes(rng, b_dtype, (k, n))
    a_zero = _codes(rng, a_dtype, ())
    zero = {"none": None, "one": _codes(rng, b_dtype, ()),
            "per column": _codes(rng, b_dtype, (n,))}[b_zero]
    got = int8_cpu.integer_product(A, a_zero, B, zero, {})
    assert got is not None and got.dtype == np.int32 and got.shape == (*lead, n)
    np.testing.assert_array_equal(got, _reference(A, a_zero, B, zero))


@needs_vnni
def test_extreme_codes_sum_without_saturating():
    """255 x -128 over K = 4096: each lane's sum reaches -133 million, far past int16."""
    A = np.full((8, 4096), 255, np.uint8)
    B = np.full((4096, 32), -128, np.int8)
    got = int8_cpu.integer_product(A, None, B, None, {})
    np.testing.assert_array_equal(got, np.full((8, 32), 255 * -128 * 4096))


@needs_vnni
def test_the_packed_weight_is_kept_and_a_changed_zero_point_is_refused():
    rng = np.random.default_rng(3)
    A, B = _codes(rng, np.uint8, (4, 16)), _codes(rng, np.int8, (16, 40))
    node: dict = {}
    first = int8_cpu.integer_product(A, None, B, np.int8(2), node)
    weight = node["int8_weight"]
    assert int8_cpu.integer_product(A, None, B, np.int8(2), node) is not first
    assert node["int8_weight"] is weight
    assert int8_cpu.integer_product(A, None, B, np.int8(5), node) is None


def test_without_vnni_or_a_constant_weight_the_float_route_runs(monkeypatch):
    rng = np.random.default_rng(4)
    A, B = _codes(rng, np.uint8, (4, 16)), _codes(rng, np.int8, (16, 8))
    assert int8_cpu.integer_product(A, None, B, None, None) is None
    monkeypatch.setattr(int8_cpu, "_VNNI", [False])
    assert int8_cpu.integer_product(A, None, B, None, {}) is None
    assert int8_cpu.integer_product(A.astype(np.int16), None, B, None, {}) is None


@needs_vnni
@pytest.mark.parametrize("op_type", ["MatMulInteger", "MatMulIntegerToFloat"])
def test_a_constant_weight_takes_the_integer_product_in_a_session(op_type, monkeypatch):
    """A session's MatMulInteger / MatMulIntegerToFloat with an initializer weight goes
    through the VNNI product and gives onnxruntime's outputs exactly."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(11)
    B, bias = _codes(rng, np.int8, (96, 48)), rng.standard_normal(48).astype(np.float32)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(np.uint8(7), "a_zero"),
             numpy_helper.from_array(np.float32(0.02), "a_scale"),
             numpy_helper.from_array(np.float32(0.01), "b_scale"),
             numpy_helper.from_array(bias, "bias")]
    if op_type == "MatMulInteger":
        node = helper.make_node(op_type, ["A", "B", "a_zero"], ["Y"])
        out_type, opsets = TensorProto.INT32, [helper.make_opsetid("", 17)]
    else:
        node = helper.make_node(op_type, ["A", "B", "a_scale", "b_scale", "a_zero", "", "bias"],
                                ["Y"], domain="com.microsoft")
        out_type = TensorProto.FLOAT
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "A", TensorProto.UINT8, [5, 96])], [helper.make_tensor_value_info("Y", out_type, None)],
        inits)
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    calls = []
    real = int8_cpu._raw_product
    monkeypatch.setattr(int8_cpu, "_raw_product", lambda *a: calls.append(1) or real(*a))
    A = _codes(rng, np.uint8, (5, 96))
    ours = mixrt.Session(model).run(None, {"A": A})[0]
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]
    assert calls and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


def _dynamic_layer(b_scale_per_column: bool, bias: bool):
    """A dynamically quantized dense layer as onnxruntime's quantizer writes it: the float
    rows quantized per call (DynamicQuantizeLinear), then MatMulIntegerToFloat against an
    8-bit initializer, its scale one value or one a column."""
    rng = np.random.default_rng(5)
    n = 40
    b_scale = (rng.uniform(0.005, 0.02, n) if b_scale_per_column else np.array(0.01)) \
        .astype(np.float32)
    inits = [numpy_helper.from_array(_codes(rng, np.int8, (70, n)), "B"),
             numpy_helper.from_array(b_scale, "b_scale"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["A", "a_scale", "a_zero"]),
             helper.make_node("MatMulIntegerToFloat",
                              ["A", "B", "a_scale", "b_scale", "a_zero", "",
                               "bias" if bias else ""], ["Y"], domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "X", TensorProto.FLOAT, [3, 6, 70])], [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, [3, 6, n])], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@needs_vnni
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_a_dynamically_quantized_layer_runs_bound_with_the_kernels_bits(monkeypatch,
                                                                       per_column, bias):
    """The product's bound call (int8_cpu.bound_product_to_float) behind DynamicQuantizeLinear's,
    whose three outputs sit in the arena: each run's scale and zero point (other rows, other
    ones) give the kernels' bits and onnxruntime's; an infinite value takes the NumPy form."""
    from mixrt.runtime import run_loop
    ort = pytest.importorskip("onnxruntime")
    model = _dynamic_layer(per_column, bias)
    session = mixrt.Session(model)
    reference = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    for seed in range(4):
        X = (np.random.default_rng(seed).standard_normal((3, 6, 70)) * (seed + 1)) \
            .astype(np.float32)
        monkeypatch.setattr(run_loop, "BIND", False)
        unbound = session.run(None, {"X": X})[0]
        monkeypatch.setattr(run_loop, "BIND", True)
        got = session.run(None, {"X": X})[0]
        np.testing.assert_array_equal(got, unbound)
        np.testing.assert_allclose(got, reference.run(None, {"X": X})[0], rtol=1e-5, atol=1e-5)
    plan = session._last_plan[1]
    bound = {step.node.op_type for arena in plan.pool for calls in arena.bound.values()
             for step, _, _, _, form in run_loop.each_call(calls)
            if form is not None and form[6] is not None}
    assert {"MatMulIntegerToFloat", "DynamicQuantizeLinear"} <= bound
    X[0, 0, 0] = np.inf  # the quantization's NumPy form, bound as unbound
    monkeypatch.setattr(run_loop, "BIND", False)
    unbound = session.run(None, {"X": X})[0]
    monkeypatch.setattr(run_loop, "BIND", True)
    np.testing.assert_array_equal(session.run(None, {"X": X})[0], unbound)
