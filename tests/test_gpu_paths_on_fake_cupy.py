"""mixrt's GPU code paths, driven on the CPU through a NumPy-backed stand-in for CuPy
(``tests/fake_cupy``). Without a GPU the GPU tests skip; here they run in a child pytest with
the fake first on ``sys.path``, so the Python around the kernels (host and device values
meeting, reductions that return device scalars, ``cupy.random``, streams and devices, the
ONNX backend suite's ``_cuda`` cases) is checked on every CI run. It proves nothing about
CUDA itself: the real GPU run happens on a CUDA machine.

Skipped where a real CuPy imports: there the GPU tests run for real.

The tests at the end are GPU tests themselves (so they skip here and run in that child, and on a
real GPU): the kernels registered with ``@fn.fast("gpu")`` are the ones a GPU session and an
imperative op on the GPU run, and each gives its generic function's result.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt import nd
from mixrt.ops import REGISTRY
from mixrt.ops.device import gpu_available

TESTS = Path(__file__).resolve().parent
FAKE = TESTS / "fake_cupy"

# the GPU tests: every test marked ``gpu`` outside the conformance suite (tests/conftest.py marks
# and checks them); the CPU tests ran in this process already. The child collects only the
# files that name a GPU, CuPy, CUDA or NCCL (in a mark, a skip's reason, a fixture), 66 of
# 222: collecting every file took ~35 s of its ~165; test_the_gpu_test_files_are_all_taken
# checks the choice against what the parent collected.
MAY_HOLD_GPU_TESTS = re.compile(r"gpu|cupy|cuda|nccl", re.IGNORECASE)


def gpu_test_files() -> list[str]:
    return sorted(str(path) for path in TESTS.rglob("test_*.py")
                  if TESTS / "conformance" not in path.parents
                  and MAY_HOLD_GPU_TESTS.search(path.read_text(encoding="utf-8")))


GPU_TESTS = (*gpu_test_files(), "-m", "gpu")
# what the fake cannot stand in for, and why
EMULATION_GAPS = {
    "test_cuda_graph.py::test_replays_return_what_plain_runs_return":
        "captures a CUDA graph; the fake's streams cannot capture, so the run falls back",
    "test_cublas_capture.py::test_products_match_cupys_and_replay_from_a_graph":
        "calls cuBLAS through ctypes on device pointers, which the fake does not have",
}

real_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                               reason="a real CuPy is installed: the GPU tests run for real")


def _pytest(*args: str, **settings: str) -> tuple[int, str]:
    """The child runs the CPU's NumPy kernels (``MIXRT_JIT=0``): there the CPU only computes
    the references the GPU paths are held to, and the compiled CPU kernels, tested in this
    process, took 60% of the child's time compiling (~200 s of a 2-core machine; ~80 s
    without)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(FAKE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        MIXRT_JIT="0", **settings)
    deselect = [a for gap in EMULATION_GAPS for a in ("--deselect", f"tests/{gap}")]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rs", *deselect, *args], cwd=TESTS.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


def _count(output: str, what: str) -> int:
    found = re.findall(rf"(\d+) {what}", output.splitlines()[-1] if output else "")
    return int(found[0]) if found else 0


@real_cupy
def test_the_gpu_tests_pass_on_the_fake_cupy():
    """The GPU tests on a fake with two GPUs whose threads start with GPU 1 current, while
    the tests ask for gpu:0 (test_two_gpus.py: gpu:1). CuPy launches a kernel on the current
    GPU and refuses (without peer access) an array of another: so a kernel, a new array or a
    copy that mixrt runs without making its arrays' GPU current fails here.
    test_two_gpus.py also checks that mixrt leaves the caller's current GPU as it was. (A
    second child on one fake GPU with GPU 0 current ran the same tests under easier
    conditions, for 2-3 minutes of the suite.)"""
    code, output = _pytest(*GPU_TESTS, FAKE_CUPY_DEVICES="2", FAKE_CUPY_START_DEVICE="1")
    assert code == 0, output[-6000:]
    # the GPU tests ran instead of skipping: what still skips needs NCCL, or PyTorch or
    # torchvision (a CUDA build, or any where the test extras leave it out), or checks the
    # refusal on a machine without a GPU
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    reasons = ("NCCL", "torch has no CUDA", "could not import 'torch'",
               "could not import 'torchvision", "without a GPU", "the refusal needs none",
               "too large for the fake CuPy")
    assert all(any(r in line for r in reasons) for line in skipped), "\n".join(skipped)
    assert "test_two_gpus.py" not in "".join(skipped)
    assert _count(output, "passed") >= 280, output[-3000:]


def test_the_gpu_test_files_are_all_taken(collected_gpu_test_files):
    """Every file in which this run collected a test marked ``gpu`` is one the child
    collects (a GPU test that named none of the words would fall out of the fake run)."""
    taken = {Path(name) for name in gpu_test_files()}
    assert collected_gpu_test_files <= taken, collected_gpu_test_files - taken


@real_cupy
def test_the_onnx_backend_suite_passes_on_the_fake_cupy():
    """Every ``_cuda`` case of the ONNX backend node and model tests, at opt_level 2 and 0:
    the same cases and tolerances as on the CPU, through ``Session(device="gpu")``."""
    code, output = _pytest(str(TESTS / "conformance"), "-k", "cuda")
    assert code == 0, output[-6000:]
    assert _count(output, "passed") >= 3000, output[-3000:]


SAMPLE = '''
import pytest

def test_unmarked_skip():
    pytest.skip("needs CuPy and a CUDA GPU")

@pytest.mark.gpu
def test_marked_skip():
    pytest.skip("needs CuPy and a CUDA GPU")

@pytest.mark.skipif(True, reason="no CUDA GPU (or no CuPy) here")
def test_skipif():
    pass

def test_other_skip():
    pytest.skip("needs torchvision")

def test_cpu():
    pass
'''


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="the hook checks only where no CuPy imports")
@pytest.mark.parametrize("selection", [(), ("-m", "gpu")], ids=["all", "gpu"])
def test_a_gpu_test_cannot_fall_out_of_the_fake_run(tmp_path, selection):
    """tests/conftest.py marks a test ``gpu`` from its skipif, and fails one that skips for
    want of a GPU from its body without the mark, which ``-m gpu`` would otherwise leave out."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", "-rA", *selection, str(tmp_path)], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(TESTS)),
                          capture_output=True, text=True, timeout=300)
    if not selection:
        assert done.returncode == 1, done.stdout
        assert "FAILED" in done.stdout and "test_unmarked_skip skips for want of a GPU" in done.stdout
        assert _count(done.stdout, "passed") == 1 and _count(done.stdout, "skipped") == 3
    else:
        assert done.returncode == 0, done.stdout
        assert _count(done.stdout, "skipped") == 2 and _count(done.stdout, "deselected") == 3


# -- the kernels registered for the GPU ----------------------------------------------------------

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(11)


def _spied(monkeypatch, kernels) -> list:
    """Each kernel's GPU function (its registered one, else the generic) wrapped to record its
    calls, as registered for the GPU: what binding a GPU session or an imperative op on the
    GPU then picks."""
    calls: list = []
    for kernel in kernels:
        chosen = kernel.for_device("gpu")

        def spy(xp, *args, _chosen=chosen, **kwargs):
            calls.append(_chosen.__name__)
            return _chosen(xp, *args, **kwargs)
        monkeypatch.setitem(kernel.fast, "gpu", spy)
    return calls


def _fused_model(program: dict, shape) -> bytes:
    node = helper.make_node("FusedElementwise", ["x"], ["y"], domain="mixrt", **program)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("mixrt", 1)],
                             ir_version=8).SerializeToString()


GELU = dict(ops=["Scalar", "Div", "Erf", "Scalar", "Add", "Mul", "Scalar", "Mul"],
            operands=[0, 1, 2, 3, 4, 0, 5, 6, 7], params=[math.sqrt(2.0), 1.0, 0.5])


@needs_gpu
def test_a_gpu_session_runs_the_kernel_registered_for_the_gpu(monkeypatch):
    fused = REGISTRY.find("mixrt", "FusedElementwise", 1)
    assert fused.fast["gpu"].__name__ == "fused_elementwise_gpu"
    calls = _spied(monkeypatch, [fused])
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    (got,) = mixrt.Session(_fused_model(GELU, x.shape), device="gpu").run(None, {"x": x})
    assert calls == ["fused_elementwise_gpu"]
    np.testing.assert_allclose(got, fused.fn(np, x, **GELU), rtol=1e-5, atol=1e-6)


@needs_gpu
def test_an_imperative_op_on_the_gpu_runs_the_kernel_registered_for_the_gpu(monkeypatch):
    """Relu's GPU kernel (ops/elementwise/elementwise_gpu.py) runs for an NDArray on the GPU;
    Tanh has none of its own: the function registered for the GPU is the generic one."""
    relu, tanh = REGISTRY.versions("", "Relu"), REGISTRY.versions("", "Tanh")
    calls = _spied(monkeypatch, relu + tanh)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    got = nd.array(x, ctx=mixrt.gpu(0)).relu()
    assert calls and set(calls) == {"relu_gpu"}
    np.testing.assert_array_equal(got.asnumpy(), np.maximum(x, 0))
    calls.clear()
    got = nd.array(x, ctx=mixrt.gpu(0)).tanh()
    assert calls and set(calls) == {tanh[-1].fn.__name__}
    np.testing.assert_allclose(got.asnumpy(), np.tanh(x), rtol=1e-6)


FUSED_PROGRAMS = {
    "gelu": GELU,
    "clip-leaky-relu": dict(ops=["Clip", "LeakyRelu"], operands=[0, 1], params=[-0.5, 2.0, 0.1]),
    "hard-sigmoid-sigmoid": dict(ops=["HardSigmoid", "Sigmoid", "Mul"], operands=[0, 1, 2, 0],
                                 params=[0.3, 0.4]),
    "pow-relu-tanh": dict(ops=["Pow", "Relu", "Tanh", "Exp", "Sub"],
                          operands=[0, 1, 0, 3, 2, 4], params=[3.0]),
}


@needs_gpu
@pytest.mark.parametrize("name", FUSED_PROGRAMS)
def test_fused_elementwise_on_the_gpu_is_its_kernel_and_the_generic_result(name):
    import cupy  # noqa: PLC0415  (the fake's, or a real one)
    program = FUSED_PROGRAMS[name]
    kernel = REGISTRY.find("mixrt", "FusedElementwise", 1)
    assert kernel.for_device("gpu") is kernel.fast["gpu"] is not kernel.fn
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    device_x = cupy.asarray(x)
    fast = kernel.for_device("gpu")(cupy, device_x, **program)
    generic = kernel.fn(cupy, device_x, **program)
    assert isinstance(fast, cupy.ndarray) and isinstance(generic, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(fast), cupy.asnumpy(generic), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(fast), kernel.fn(np, x, **program), rtol=1e-5,
                               atol=1e-6)
    out = cupy.empty(x.shape, cupy.float32)
    assert kernel.for_device("gpu")(cupy, device_x, **program, out=out) is out
    np.testing.assert_allclose(cupy.asnumpy(out), cupy.asnumpy(generic), rtol=1e-5, atol=1e-6)


# -- the ops whose CPU paths are registered with .fast("cpu") ------------------------------------
# (ops/nn/fused_cpu.py, attention/attention_cpu.py, quant/quantize_cpu.py, rnn/recurrent_cpu.py,
# conv/conv_pool_cpu.py): on the GPU their generic kernel runs, and gives the CPU path's result


def _codes(dtype, shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _normal(*shape):
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


MOVED = {  # (domain, op_type, version) -> (inputs, attributes, tolerance)
    ("mixrt", "FusedConv", 1): lambda: (
        [_normal(1, 4, 9, 9), _normal(6, 4, 3, 3), _normal(6), _normal(1, 6, 9, 9)],
        dict(pads=[1, 1, 1, 1], activation="Relu"), 1e-4),
    ("mixrt", "FusedGemm", 1): lambda: (
        [_normal(8, 32), _normal(16, 32), _normal(16)],
        dict(transB=1, activation="LeakyRelu", activation_params=[0.1]), 1e-4),
    ("mixrt", "FusedMatMul", 1): lambda: (
        [_normal(2, 5, 32), _normal(32, 16), _normal(16), _normal(2, 5, 16)],
        dict(activation="Relu"), 1e-4),
    ("mixrt", "FusedAttention", 1): lambda: (
        [_normal(2, 7, 3, 8), _normal(2, 9, 3, 8), _normal(2, 9, 3, 8), _normal(2, 1, 1, 9)],
        dict(scale=0.3), 1e-5),
    ("mixrt", "FusedConvPool", 1): lambda: (
        [_normal(1, 3, 16, 16), _normal(6, 3, 3, 3), _normal(6)],
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], activation="Relu", lrn_size=3,
             pool_kernel_shape=[2, 2], pool_strides=[2, 2]), 1e-4),
    ("", "MatMulInteger", 10): lambda: (
        [_codes(np.uint8, (5, 40)), _codes(np.int8, (40, 12)), np.array(3, np.uint8)], {}, 0),
    ("com.microsoft", "MatMulIntegerToFloat", 1): lambda: (
        [_codes(np.uint8, (5, 40)), _codes(np.int8, (40, 12)), np.array(0.02, np.float32),
         np.array(0.01, np.float32), np.array(3, np.uint8)], {}, 1e-6),
    ("", "LSTM", 14): lambda: (
        [_normal(5, 2, 4), _normal(1, 24, 4), _normal(1, 24, 6), _normal(1, 48)],
        dict(hidden_size=6), 1e-5),
    ("", "GRU", 14): lambda: (
        [_normal(5, 2, 4), _normal(1, 18, 4), _normal(1, 18, 6), _normal(1, 36)],
        dict(hidden_size=6, linear_before_reset=1), 1e-5),
    ("", "RNN", 14): lambda: (
        [_normal(5, 2, 4), _normal(1, 6, 4), _normal(1, 6, 6), _normal(1, 12)],
        dict(hidden_size=6), 1e-5),
}


@needs_gpu
@pytest.mark.parametrize("key", MOVED, ids=lambda key: key[1])
def test_an_op_with_a_cpu_fast_path_runs_another_kernel_on_the_gpu(key):
    """Its generic kernel, or one registered for the GPU (FusedConv's, through cuDNN), and
    the same results as the CPU's fast path."""
    import cupy  # noqa: PLC0415  (the fake's, or a real one)
    kernel = REGISTRY.find(*key)
    assert kernel.for_device("cpu") is not kernel.fn
    assert kernel.for_device("gpu") is kernel.fast.get("gpu", kernel.fn)
    inputs, attributes, tolerance = MOVED[key]()
    got = kernel.for_device("gpu")(cupy, *(cupy.asarray(x) for x in inputs), **attributes)
    want = kernel.for_device("cpu")(np, *inputs, **attributes)
    for have, expected in zip(got if isinstance(got, (tuple, list)) else [got],
                              want if isinstance(want, (tuple, list)) else [want]):
        assert isinstance(have, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(have), expected, rtol=tolerance,
                                   atol=tolerance)


@needs_gpu
def test_a_gpu_session_binds_fused_convs_gpu_kernel(monkeypatch):
    fused = REGISTRY.find("mixrt", "FusedConv", 1)
    calls = _spied(monkeypatch, [fused])
    w = helper.make_tensor("w", TensorProto.FLOAT, (6, 3, 3, 3), _normal(6, 3, 3, 3).ravel())
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8).SerializeToString()
    x = _normal(1, 3, 8, 8)
    (got,) = mixrt.Session(model, device="gpu", opt_level=2).run(None, {"x": x})
    assert calls == ["fused_conv_gpu"]
    (want,) = mixrt.Session(model, opt_level=2).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
