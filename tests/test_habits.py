"""The habits a user expects of any well-kept Python tool, each tried the way a user meets it:
the ``mixrt`` command in a real process, ``import mixrt`` in a fresh interpreter."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import flat_digits, mlp_graph
from onnx import TensorProto, helper

import mixrt
from mixrt.errors import InputError
from mixrt.io import NDArrayIter
from mixrt.module import Module
from mixrt.ops.device import gpu_count

ROOT = Path(__file__).resolve().parent.parent


def _mixrt(*args, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mixrt", *map(str, args)], capture_output=True,
                          text=True, timeout=300, **options)


@pytest.fixture(scope="module")
def relu_model(tmp_path_factory) -> Path:
    """y = Relu(x), x float32 [N, 4] with a symbolic batch dimension."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu0")], "g",
                              [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="habits-test", producer_version="1.0")
    path = tmp_path_factory.mktemp("habits") / "relu.onnx"
    onnx.save(model, path)
    return path


def test_version_prints_the_packages_version_and_exits_0():
    done = _mixrt("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"mixrt {mixrt.__version__}"


def test_import_leaves_the_environment_as_it_was():
    probe = ("import json, os\nbefore = dict(os.environ)\nimport mixrt\n"
             "print(json.dumps([k for k in set(before) | set(os.environ)\n"
             "                  if before.get(k) != os.environ.get(k)]))")
    for extra in ({}, {"OPENBLAS_THREAD_TIMEOUT": "20"}, {"OPENBLAS_CORETYPE": "Haswell"}):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT")}
        done = subprocess.run([sys.executable, "-c", probe], env={**env, **extra},
                              capture_output=True, text=True, timeout=120, check=True)
        assert done.stdout.strip().splitlines()[-1] == "[]", (extra, done.stdout)


def test_a_misspelt_session_option_is_refused_naming_the_right_one(relu_model):
    with pytest.raises(InputError, match=r"'devcie'.*did you mean 'device'"):
        mixrt.Session(relu_model, devcie="gpu:0")
    with pytest.raises(InputError, match="'fast'"):
        mixrt.load(relu_model, fast=True)
    # onnxruntime's own arguments still run unchanged
    session = mixrt.Session(relu_model, sess_options=None, providers=["CPUExecutionProvider"],
                            provider_options=[{}])
    assert session.run(None, {"x": np.ones((1, 4), np.float32)})[0].shape == (1, 4)


def test_a_reader_closing_the_pipe_ends_the_command_quietly(relu_model):
    """``mixrt info M | head -0``: the reader is gone before the command writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "mixrt", "info", str(relu_model)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141  # 128 + SIGPIPE, as a shell reports `yes | head -1`'s yes


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the check would pass")
def test_check_on_a_gpu_this_machine_lacks_fails_unless_asked_of_the_registry(relu_model):
    done = _mixrt("check", relu_model, "--device", "gpu:0")
    assert done.returncode == 2
    assert "'gpu:0'" in done.stderr and "no CUDA GPU" in done.stderr
    assert _mixrt("check", relu_model, "--device", "gpu:0", "--validate").returncode == 2
    registry = _mixrt("check", relu_model, "--device", "gpu:3", "--registry-only")
    assert registry.returncode == 0, registry.stderr
    assert "1 of 1 nodes supported on gpu:3" in registry.stdout


def test_a_dim_no_input_declares_is_refused(relu_model, tmp_path):
    for command in (["check", relu_model, "--validate"], ["compile", relu_model, "-o",
                                                          tmp_path / "m.mxr"],
                    ["plan", relu_model]):
        done = _mixrt(*command, "--dim", "NN=4")
        assert done.returncode == 2, (command, done.stdout)
        assert "'NN' (did you mean 'N'?)" in done.stderr
    right = _mixrt("check", relu_model, "--validate", "--dim", "N=4")
    assert right.returncode == 0, right.stdout + right.stderr
    # --dim gives sizes to run with; check without --validate runs nothing
    assert _mixrt("check", relu_model, "--dim", "N=4").returncode == 2


def test_python_lists_feed_a_tensor_input_in_its_declared_dtype(relu_model):
    session = mixrt.Session(relu_model)
    (out,) = session.run(None, {"x": [[1.0, -2.0, 3.0, 4.0]]})
    assert out.dtype == np.float32 and out.tolist() == [[1, 0, 3, 4]]
    (out,) = session.run(None, {"x": ([1, -2, 3, 4],)})  # ints into a float input: exact
    assert out.tolist() == [[1, 0, 3, 4]]
    with pytest.raises(InputError, match="'x'.*not a rectangular array"):
        session.run(None, {"x": [[1.0, 2.0, 3.0, 4.0], [1.0]]})
    with pytest.raises(InputError, match="'x'.*shape|'x'.*dimension"):
        session.run(None, {"x": [1.0, 2.0]})


def test_a_list_that_an_integer_input_cannot_hold_is_refused_naming_it():
    x = helper.make_tensor_value_info("ids", TensorProto.INT32, [3])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [3])
    graph = helper.make_graph([helper.make_node("Neg", ["ids"], ["y"])], "g", [x], [y])
    session = mixrt.Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert session.run(None, {"ids": [1, 2, 3]})[0].tolist() == [-1, -2, -3]
    with pytest.raises(InputError, match="'ids' expects int32.*float64"):
        session.run(None, {"ids": [1.5, 2.0, 3.0]})
    with pytest.raises(InputError, match="'ids' expects int32"):
        session.run(None, {"ids": [1, 2, 2**40]})


def test_info_on_a_compiled_model_names_the_model_it_was_compiled_from(relu_model, tmp_path):
    target = tmp_path / "relu.mxr"
    assert _mixrt("compile", relu_model, "-o", target, "--dim", "N=2").returncode == 0
    info = _mixrt("info", target)
    assert info.returncode == 0, info.stderr
    digest = hashlib.sha256(relu_model.read_bytes()).hexdigest()
    assert (f"compiled from: relu.onnx (sha256 {digest}, {relu_model.stat().st_size:,} bytes, "
            f"written by habits-test 1.0)") in info.stdout
    # the absolute path stays on the machine that compiled it
    assert str(relu_model.parent) not in target.read_bytes().decode("latin-1")


def test_the_package_ships_py_typed():
    assert (Path(mixrt.__file__).parent / "py.typed").is_file()


def test_fit_in_a_pipe_prints_one_line_per_epoch_instead_of_a_bar(capsys):
    xt, yt, _, _ = flat_digits()
    model = Module(mlp_graph(64, 16, 10, 0, np.float32))
    model.fit(NDArrayIter(xt[:256], yt[:256], 64), epochs=3)
    said = capsys.readouterr().err
    assert "\r" not in said
    lines = said.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert "loss" in lines[0] and "train_accuracy" in lines[0]
    model.fit(NDArrayIter(xt[:256], yt[:256], 64), epochs=1, progress=False)
    assert capsys.readouterr().err == ""


def test_import_mixrt_defers_the_heavy_packages():
    """``import mixrt`` (and so ``mixrt --version``) loads neither onnx nor numba: a service
    pays for them when it loads a model and when its kernels compile, not before."""
    probe = ("import sys, mixrt\n"
             "print(sorted(m for m in ('onnx', 'numba', 'llvmlite', 'cupy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
