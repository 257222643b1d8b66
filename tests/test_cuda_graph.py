"""Session(cuda_graph=True): a GPU session replays each signature's planned run as a CUDA
graph (runtime/cuda_graph.py). On a machine without a GPU only the refusal runs."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import InputError
from mixrt.ops.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(5)


def conv_model():
    """Conv -> Relu -> MaxPool -> Flatten -> Gemm: the kernels a zoo model's run is made of."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["y"], transB=1)]
    weights = [numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
                                       "w"),
               numpy_helper.from_array(RNG.standard_normal((10, 8 * 8 * 8)).astype(np.float32),
                                       "g")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3, 16, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_cuda_graphs_need_a_gpu_session():
    with pytest.raises(InputError, match="cuda_graph=True .* needs a GPU device"):
        mixrt.Session(conv_model(), cuda_graph=True)


@needs_gpu
def test_replays_return_what_plain_runs_return():
    model = conv_model()  # once: each call draws new weights
    plain = mixrt.Session(model, device="gpu")
    graphed = mixrt.Session(model, device="gpu", cuda_graph=True)
    for _ in range(4):  # discovery, capture + first launch, then replays
        x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
        want = plain.run(None, {"x": x})[0]
        got = graphed.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(graphed._captures.runs) == 1 and not graphed._captures.failed


@needs_gpu
def test_a_run_that_cannot_be_captured_runs_the_plain_way():
    # NonZero's output shape depends on the data: its kernel reads values back to the host
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = mixrt.Session(model, device="gpu", cuda_graph=True)
    # (the fake CuPy of tests/test_gpu_paths_on_fake_cupy.py cannot capture at all)
    with pytest.warns(RuntimeWarning, match=r"x \(4, 5\) run without a CUDA graph: "
                      r"(ExecutionError: node .*NonZero|NotImplementedError: fake CuPy)"):
        for _ in range(3):
            x = (RNG.standard_normal((4, 5)) > 0).astype(np.float32)
            np.testing.assert_array_equal(session.run(None, {"x": x})[0],
                                          np.array(np.nonzero(x)))
    assert list(session._captures.failed) and not session._captures.runs
