"""mixrt's GPU code paths, driven on the CPU through a NumPy-backed stand-in for CuPy
(``tests/fake_cupy``). Without a GPU the GPU tests skip; here they run in a child pytest with
the fake first on ``sys.path``, so the Python around the kernels (host and device values
meeting, reductions that return device scalars, ``cupy.random``, streams and devices, the
ONNX backend suite's ``_cuda`` cases) is checked on every CI run. It proves nothing about
CUDA itself: the real GPU run happens on a CUDA machine.

Skipped where a real CuPy imports: there the GPU tests run for real.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FAKE = TESTS / "fake_cupy"

# the GPU tests: every test marked ``gpu`` outside the conformance suite (tests/conftest.py marks
# and checks them); the CPU tests ran in this process already
GPU_TESTS = (str(TESTS), "--ignore", str(TESTS / "conformance"), "-m", "gpu")
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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(FAKE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        **settings)
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
    code, output = _pytest(*GPU_TESTS)
    assert code == 0, output[-6000:]
    # the GPU tests ran instead of skipping: what still skips needs 2 GPUs, NCCL, or
    # PyTorch or torchvision (a CUDA build, or any where the test extras leave it out), or checks
    # the refusal on a machine without a GPU
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    reasons = ("2 NVIDIA GPUs", "NCCL", "torch has no CUDA", "could not import 'torch'",
               "could not import 'torchvision",
               "without a GPU", "the refusal needs none")
    assert all(any(r in line for r in reasons) for line in skipped), "\n".join(skipped)
    assert _count(output, "passed") >= 270, output[-3000:]


@real_cupy
def test_every_gpu_run_makes_its_own_gpu_current():
    """The GPU tests again, on a fake with two GPUs whose threads start with GPU 1 current,
    while the tests ask for gpu:0 (test_two_gpus.py: gpu:1). CuPy launches a kernel on the
    current GPU and refuses (without peer access) an array of another: so a kernel, a new
    array or a copy that mixrt runs without making its arrays' GPU current fails here.
    test_two_gpus.py also checks that mixrt leaves the caller's current GPU as it was."""
    code, output = _pytest(*GPU_TESTS,
                           FAKE_CUPY_DEVICES="2", FAKE_CUPY_START_DEVICE="1")
    assert code == 0, output[-6000:]
    assert "test_two_gpus.py" not in "".join(
        line for line in output.splitlines() if line.startswith("SKIPPED"))
    assert _count(output, "passed") >= 280, output[-3000:]


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
