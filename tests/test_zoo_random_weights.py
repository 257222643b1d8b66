"""The 9 light zoo architectures with seeded random weights, against onnxruntime.

The zoo files' weights are one constant, so every output channel of a layer is equal and a
kernel or fusion that mixed up channels would still match their references
(``test_passes.py`` checks those). Here the same graphs carry He-initialized weights and
their logits are an output too, and mixrt's outputs must equal onnxruntime's to float32
rounding: before optimization, after every pass and fusion (opt_level 2, the direct and
Winograd convolutions, the fused epilogues) and, where a GPU is present, on it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from mixrt.models.zoo import LIGHT_MODELS, light_model_with_random_weights
from mixrt.ops.device import gpu_available
from mixrt.runtime.session import Session

ort = pytest.importorskip("onnxruntime")

# measured here: at most 1e-6 of the largest output (the logits reach 3-25), on either path
TOLERANCE = 2e-5


# one xdist worker a model, so that its module-scoped fixture (the weights drawn, the file
# written and onnxruntime's reference run: VGG-19's ~17 s) is built once, not on each worker
MODELS = [pytest.param(name, marks=pytest.mark.xdist_group(f"zoo-random-{name}"))
          for name in LIGHT_MODELS]
# the models whose fully connected layers hold most of their weights (VGG-19's 548 MB): on
# the NumPy-backed fake CuPy (tests/test_gpu_paths_on_fake_cupy.py) they took 53 of its
# run's ~100 s drawing and copying those weights, for no operator that Inception-v1 does not
# run there too
LARGE_ON_THE_FAKE = {"vgg19", "zfnet512", "bvlc_alexnet"}


@pytest.fixture(scope="module", params=MODELS)
def randomized(request, tmp_path_factory):
    return _randomized(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=MODELS)
def randomized_for_the_gpu(request, tmp_path_factory):
    """:func:`randomized`, but the large models skip on the fake CuPy before they are built
    (the GPU test skips before this without a GPU, so nothing is built twice)."""
    if request.param in LARGE_ON_THE_FAKE and _on_the_fake_cupy():
        pytest.skip("too large for the fake CuPy: its operators run there in Inception-v1")
    return _randomized(request.param, tmp_path_factory)


def _randomized(name, tmp_path_factory):
    model, feeds = light_model_with_random_weights(name)
    path = tmp_path_factory.mktemp(name) / f"{name}_random.onnx"
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the zoo files list unused initializers
    reference = ort.InferenceSession(str(path), options,
                                     providers=["CPUExecutionProvider"]).run(None, feeds)
    return path, feeds, reference


def _on_the_fake_cupy() -> bool:
    import cupy  # noqa: PLC0415  (asked only where gpu_available() imported one)
    return getattr(cupy, "IS_FAKE", False)


def assert_matches(outputs, reference):
    assert len(outputs) == len(reference)
    for got, want in zip(outputs, reference):
        assert got.shape == want.shape and got.dtype == want.dtype
        scale = max(1.0, float(np.abs(want).max()))
        assert float(np.abs(got - want).max()) <= TOLERANCE * scale


def test_the_random_weights_make_the_outputs_depend_on_them(randomized):
    """The check below means something: the logits spread over units (a constant-weight
    model's are all equal), and no value overflowed."""
    _, _, reference = randomized
    logits = reference[-1]
    assert np.all(np.isfinite(logits)) and np.ptp(logits) > 1.0


@pytest.mark.parametrize("level", [0, 2])
def test_matches_onnxruntime(randomized, level):
    path, feeds, reference = randomized
    assert_matches(Session(path, opt_level=level).run(None, feeds), reference)


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_matches_onnxruntime_on_the_gpu(randomized_for_the_gpu):
    path, feeds, reference = randomized_for_the_gpu
    session = Session(path, opt_level=2, device="gpu")
    for _ in range(2):  # the discovery run, then the planned one
        assert_matches(session.run(None, feeds), reference)


def test_the_weights_are_seeded():
    first, _ = light_model_with_random_weights("squeezenet", seed=3)
    again, _ = light_model_with_random_weights("squeezenet", seed=3)
    other, _ = light_model_with_random_weights("squeezenet", seed=4)
    assert first.SerializeToString() == again.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()
    assert "ConstantOfShape" not in {n.op_type for n in first.graph.node}
