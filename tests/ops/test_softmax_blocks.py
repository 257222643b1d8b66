"""Softmax's narrow rows a block of rows at a time (ops/panels/_jit_vector_softmax.py
``_softmax_block``): the same bits as the row form gives each row, for every width up to a
vector's lanes, partial blocks, NaN and -inf, in float32 and float64; and a Softmax node of
a classifier's few classes over many rows takes it and matches onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.compiled import jit_cpu

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled kernels are off")


def _kernels():
    return jit_cpu.load("mixrt.ops.panels._jit_vector_softmax")


def _by_rows():
    """The row form over each row, as softmax_rows took every row before."""
    import numba  # noqa: PLC0415  (the compiled kernels' own import)
    row = _kernels()._softmax_row

    @numba.njit
    def by_rows(flat, rows, n):
        for r in range(rows):
            row(flat, r * n, n)
    return by_rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocks_of_rows_give_each_rows_bits(dtype):
    by_rows, kernels = _by_rows(), _kernels()
    lanes = jit_cpu.vector_bytes() // np.dtype(dtype).itemsize
    bits = np.uint32 if dtype == np.float32 else np.uint64
    rng = np.random.default_rng(5)
    for n in range(1, lanes + 1):
        for rows in (1, lanes - 1, lanes, lanes + 1, 3 * lanes + 5):
            x = (rng.standard_normal((rows, n)) * 30).astype(dtype)
            if rows > 3:
                x[1] = -np.inf  # every score masked: NaN, as the row form gives
                x[2, n - 1] = np.nan  # the row's NaN spreads through its sum
                x[3, 0] = -np.inf  # one masked score weighs exactly nothing
            blocks, reference = x.reshape(-1).copy(), x.reshape(-1).copy()
            kernels.softmax_rows(blocks, rows, n)
            by_rows(reference, rows, n)
            assert np.array_equal(blocks.view(bits), reference.view(bits)), (n, rows)


def test_a_classifiers_softmax_over_many_rows_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]),
         helper.make_node("Softmax", ["scores"], ["y"], axis=1)],
        "classes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [32, 10],
                            np.random.default_rng(2).standard_normal(320).tolist())])
    path = tmp_path / "classes.onnx"
    path.write_bytes(helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString())
    x = np.random.default_rng(3).standard_normal((1000, 32)).astype(np.float32)
    (got,) = mixrt.Session(str(path)).run(None, {"x": x})
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
