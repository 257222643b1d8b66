"""GPU convolutions through cuDNN (ops/conv/cudnn.py, ops/conv/conv_gpu.py): forward, data and
filter gradients against the generic im2col kernels on the CPU, for plain, strided, dilated,
grouped, depthwise, asymmetrically padded, 1-D and 3-D convolutions; one plan and one
algorithm choice per shape; the algorithm choice skipping what does not fit; TF32 only when
allowed; the im2col path, said once, where cuDNN is absent.

On the fake CuPy these run against tests/fake_cudnn.py (a NumPy convolution over the memory
the pointers name); on a real GPU against the real cuDNN."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.conv import conv as generic
from mixrt.ops.conv import conv_grad as generic_grad
from mixrt.ops.conv import cudnn
from mixrt.ops.conv.conv_gpu import conv_gpu, conv_grad_gpu
from mixrt.ops.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(5)

# (x shape, w shape, attributes)
CASES = {
    "plain 3x3": ((2, 3, 8, 8), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    "strided, unpadded": ((2, 4, 9, 7), (6, 4, 3, 2), dict(strides=[2, 2])),
    "dilated": ((1, 2, 10, 10), (3, 2, 3, 3), dict(dilations=[2, 2], pads=[2, 1, 2, 1])),
    "grouped": ((2, 6, 7, 7), (4, 3, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    "depthwise": ((2, 5, 8, 8), (5, 1, 3, 3), dict(group=5, pads=[1, 1, 1, 1],
                                                    strides=[2, 2])),
    "asymmetric pads": ((1, 3, 8, 8), (2, 3, 3, 3), dict(auto_pad="SAME_UPPER",
                                                        strides=[2, 2])),
    "1x1": ((3, 8, 5, 5), (4, 8, 1, 1), {}),
    "1-D": ((2, 3, 11), (4, 3, 3), dict(pads=[2, 0], strides=[2])),
    "3-D": ((1, 2, 5, 6, 4), (3, 2, 3, 3, 2), dict(pads=[1, 1, 0, 1, 1, 1])),
}
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 2e-2}


@pytest.fixture
def library():  # noqa: PT004
    """The cuDNN the kernels call: the fake's on the fake CuPy, the real one on a GPU."""
    import cupy  # noqa: PLC0415
    if getattr(cupy, "IS_FAKE", False):
        import fake_cudnn  # noqa: PLC0415
        fake = fake_cudnn.FakeCudnn()
        previous = cudnn.use_library(fake)
        yield fake
        cudnn.restore_library(previous)
    else:
        if not cudnn.available():
            pytest.skip("needs cuDNN beside CuPy on the GPU")
        yield None


@pytest.fixture
def fake_library(library):
    """The fake cuDNN, for the tests that read its records of the calls."""
    if library is None:
        pytest.skip("reads the fake cuDNN's records of the calls: fake CuPy only")
    return library


def _operands(case, dtype):
    x_shape, w_shape, attributes = CASES[case]
    x = RNG.standard_normal(x_shape).astype(dtype)
    w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    return x, w, attributes


def _close(actual, expected, dtype):
    import cupy  # noqa: PLC0415
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(cupy.asnumpy(actual).astype(np.float64),
                               np.asarray(expected, dtype=np.float64), rtol=tolerance,
                               atol=tolerance)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_three_convolutions_match_the_generic_kernels(library, case, dtype):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands(case, dtype)
    bias = RNG.standard_normal(w.shape[0]).astype(dtype)
    expected = generic.conv(np, x, w, bias, **attributes)
    dy = RNG.standard_normal(expected.shape).astype(dtype)
    dx, dw, db = generic_grad.conv_grad(np, dy, x, w, **attributes, bias_grad=1)
    on_gpu = [cupy.asarray(v) for v in (x, w, bias, dy)]
    _close(conv_gpu(cupy, *on_gpu[:3], **attributes), expected, dtype)
    got = conv_grad_gpu(cupy, on_gpu[3], *on_gpu[:2], **attributes, bias_grad=1)
    for actual, wanted in zip(got, (dx, dw, db)):
        _close(actual, wanted, dtype)
    if library is not None:  # each direction ran through cuDNN, once
        assert sorted(launch[0] for launch in library.launches) == ["data", "filter",
                                                                    "forward"]


@needs_gpu
def test_the_output_is_written_into_the_view_given(library):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("plain 3x3", "float32")
    out = cupy.empty((2, 4, 8, 8), dtype=np.float32)
    y = conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes, out=out)
    assert y is out
    _close(out, generic.conv(np, x, w, **attributes), "float32")


@needs_gpu
def test_a_shape_is_planned_and_its_algorithms_chosen_once(library):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("grouped", "float32")
    x, w = cupy.asarray(x), cupy.asarray(w)
    # plans are kept a process long: an earlier test in this worker may have made this one
    cudnn._plan_for.cache_clear()
    before = cudnn._plan_for.cache_info()
    for _ in range(3):
        y = conv_gpu(cupy, x, w, **attributes)
        conv_grad_gpu(cupy, y, x, w, **attributes)
    after = cudnn._plan_for.cache_info()
    assert after.misses - before.misses == 1 and after.hits - before.hits == 8
    if library is not None:
        assert sorted(q[0] for q in library.queries) == ["data", "filter", "forward"]
        assert len(library.launches) == 9
        # a new batch size is a new plan, with its own choice
        conv_gpu(cupy, cupy.concatenate([x, x]), w, **attributes)
        assert len(library.queries) == 4


@needs_gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_float32_keeps_exact_products_unless_tf32_is_allowed(fake_library, tf32):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("plain 3x3", "float32")
    previous = cudnn.allow_tf32(tf32)
    try:
        conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)
    finally:
        cudnn.allow_tf32(previous)
    # the requested math, and the algorithm run with it: the fake ranks a tensor-core
    # algorithm third, which exact float32 must pass over and TF32 may take
    assert fake_library.queries[-1] == ("forward",
                                   cudnn._DEFAULT_MATH if tf32 else cudnn._FMA_MATH)
    direction, algorithm, math, workspace, _ = fake_library.launches[-1]
    assert direction == "forward"
    if tf32:
        assert (algorithm, math, workspace) == (2, cudnn._TENSOR_OP_MATH, 0)
    else:
        assert (algorithm, math, workspace) == (7, cudnn._FMA_MATH, 4096)


@needs_gpu
def test_half_precision_asks_for_tensor_cores_with_float32_sums(fake_library):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("plain 3x3", "float16")
    conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)
    convolutions = [o for o in fake_library.objects.values() if o["kind"] == "convolution"]
    assert convolutions and all(o["compute"] == 0 for o in convolutions)  # float32 sums
    assert fake_library.queries[-1][1] == cudnn._TENSOR_OP_MATH


@needs_gpu
def test_the_workspace_and_stream_are_the_callers(fake_library):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("dilated", "float32")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)
    _, algorithm, _, workspace, launched_on = fake_library.launches[-1]
    assert algorithm == 7 and workspace == 4096 and launched_on == stream.ptr


@needs_gpu
def test_plans_give_their_descriptors_back(fake_library):
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands("1-D", "float32")
    conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)
    assert fake_library.live_descriptors() == 4  # x, w, y and the convolution
    cudnn._plan_for.cache_clear()
    assert fake_library.live_descriptors() == 0


@needs_gpu
def test_without_cudnn_the_im2col_path_runs_and_says_so_once():
    import cupy  # noqa: PLC0415
    previous = cudnn.use_library(cudnn.CudnnError("no libcudnn.so.9 here"))
    said = list(cudnn._said_absent)
    cudnn._said_absent.clear()
    try:
        x, w, attributes = _operands("grouped", "float32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                y = conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)
        messages = [str(c.message) for c in caught if "cuDNN" in str(c.message)]
        assert messages == ["GPU convolutions run as im2col + cuBLAS products, without "
                            "cuDNN: no libcudnn.so.9 here"]
        _close(y, generic.conv(np, x, w, **attributes), "float32")
    finally:
        cudnn._said_absent[:] = said
        cudnn.restore_library(previous)


@needs_gpu
def test_an_algorithm_error_names_the_call(fake_library):
    import cupy  # noqa: PLC0415
    fake_library.cudnnConvolutionForward = lambda *args: 2000
    x, w, attributes = _operands("plain 3x3", "float32")
    with pytest.raises(cudnn.CudnnError, match=r"cudnnConvolutionForward returned status "
                                               r"2000 \(fake status 2000\)"):
        conv_gpu(cupy, cupy.asarray(x), cupy.asarray(w), **attributes)


def _conv_model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [
        helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
        helper.make_tensor("b", TensorProto.FLOAT, b.shape, b.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import onnx  # noqa: PLC0415
    onnx.save(model, path)
    return path


@needs_gpu
def test_a_gpu_session_convolves_through_cudnn(library, tmp_path):
    path = _conv_model(tmp_path / "conv.onnx")
    x = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    expected = mixrt.Session(str(path)).run(None, {"x": x})[0]
    got = mixrt.Session(str(path), device="gpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    if library is not None:
        assert [launch[0] for launch in library.launches] == ["forward"]


class _Declared:
    """Stands where a CDLL is for ``_declare``: every attribute takes argtypes."""

    def __getattr__(self, name):
        value = type(name, (), {})()
        setattr(self, name, value)
        return value


def test_device_pointers_are_declared_whole():
    """Every argument that carries a device pointer, a handle or a descriptor is declared
    a pointer (an undeclared int past 2**31 would be cut to a C int), and the perf
    record has cuDNN's 48-byte layout."""
    declared = _Declared()
    cudnn._declare(declared)
    launch = declared.cudnnConvolutionForward.argtypes
    pointer_positions = [0, 1, 2, 3, 4, 5, 6, 8, 10, 11, 12]
    assert [launch[i] for i in pointer_positions] == [ctypes.c_void_p] * 11
    assert launch[7] is ctypes.c_int and launch[9] is ctypes.c_size_t
    for name in ("cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"):
        assert getattr(declared, name).argtypes == launch
    assert ctypes.sizeof(cudnn._Perf) == 48


def _small_convnet():
    """data (N, 1, 8, 8) -> logits (N, 10): two convolutions (the second strided and
    grouped) with batch norm and ReLU, global pooling, a dense layer."""
    from mixrt import sym  # noqa: PLC0415
    from mixrt.models.layers import batch_norm, conv2d, dense  # noqa: PLC0415
    x = sym.Variable("data", shape=(None, 1, 8, 8))
    x = sym.Relu(batch_norm(conv2d(x, 1, 4, 3, "c1", pad=1, bias=True), 4, "bn1"))
    weight = sym.Variable("c2_weight", shape=(8, 2, 3, 3))
    x = sym.Conv(x, weight, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=2,
                 name="c2")
    x = sym.Relu(batch_norm(x, 8, "bn2"))
    x = sym.Flatten(sym.GlobalAveragePool(x), axis=1)
    return dense(x, 8, 10, "fc")


@needs_gpu
def test_a_gpu_training_step_runs_its_convolutions_through_cudnn(library):
    """Three SGD steps of a small convolutional network on the GPU give the CPU's losses and
    weights, every convolution's forward and both gradients going through cuDNN."""
    from mixrt import random as mixrt_random  # noqa: PLC0415
    from mixrt.gluon import Trainer  # noqa: PLC0415
    from mixrt.module import Module  # noqa: PLC0415
    from mixrt.ops.device import to_host  # noqa: PLC0415
    x = RNG.standard_normal((16, 1, 8, 8)).astype(np.float32)
    y = RNG.integers(0, 10, 16).astype(np.int64)
    losses, weights = {}, {}
    for device in ("cpu", "gpu"):
        mixrt_random.seed(3)
        model = Module.from_symbol(_small_convnet(), device=device)
        trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.1,
                                                            "momentum": 0.9})
        losses[device] = [model.train_step(x, y, trainer)[0] for _ in range(3)]
        weights[device] = {name: to_host(p.raw()) for name, p in model.params.items()}
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=1e-4)
    for name, value in weights["cpu"].items():
        np.testing.assert_allclose(weights["gpu"][name], value, rtol=1e-3, atol=1e-5,
                                   err_msg=name)
    if library is not None:
        directions = [launch[0] for launch in library.launches]
        # the first convolution's input needs no gradient: its data gradient is never run
        assert directions.count("forward") == 6 and directions.count("filter") == 6
        assert directions.count("data") == 3


def _installed_cudnn() -> list:
    from mixrt.base import cuda_libraries
    return cuda_libraries._wheel_paths("cudnn", "libcudnn.so.9")


@pytest.mark.skipif(not _installed_cudnn(), reason="no cuDNN 9 wheel is installed")
def test_every_declared_call_is_in_the_installed_cudnn():
    """Each cuDNN function mixrt calls exists under that name in the cuDNN 9 wheel beside
    PyTorch (loading needs no GPU; starting it does)."""
    library = ctypes.CDLL(_installed_cudnn()[0], mode=ctypes.RTLD_GLOBAL)
    cudnn._declare(library)
    assert library.cudnnGetVersion() >= 90000


@needs_gpu
@pytest.mark.parametrize("case", ["plain 3x3", "asymmetric pads", "1-D"])
@pytest.mark.parametrize("input_grad", [1, 0])
def test_the_first_gradient_is_written_into_out(library, case, input_grad):
    """ConvGrad's first output (dX, or dW without it) goes into the arena's view given as
    ``out`` where cuDNN can write there (not where pads were put into the input: that dX is
    cropped, and handed back for the run loop to place), with the values it returns
    without ``out``."""
    import cupy  # noqa: PLC0415
    x, w, attributes = _operands(case, "float32")
    x, w = cupy.asarray(x), cupy.asarray(w)
    dy = cupy.asarray(RNG.standard_normal(conv_gpu(cupy, x, w, **attributes).shape)
                      .astype(np.float32))
    flags = dict(input_grad=input_grad, weight_grad=1)
    plain = conv_grad_gpu(cupy, dy, x, w, **attributes, **flags)
    first = (x if input_grad else w)
    out = cupy.full(first.shape, 7, dtype=np.float32)
    got = conv_grad_gpu(cupy, dy, x, w, **attributes, **flags, out=out)
    got, plain = (got if isinstance(got, tuple) else (got,)), \
        (plain if isinstance(plain, tuple) else (plain,))
    uneven = case in ("asymmetric pads", "1-D")  # both pad one side more than the other
    assert (got[0] is out) == (not uneven or not input_grad)
    for mine, reference in zip(got, plain, strict=True):
        assert mine.shape == reference.shape
        np.testing.assert_allclose(cupy.asnumpy(mine), cupy.asnumpy(reference), rtol=1e-6,
                                   atol=1e-6)
