"""Captured training steps (``train_step(..., cuda_graph=True)``, runtime/cuda_graph.py): the
forward and backward replayed as one CUDA graph that reads the parameters in place, and hands
back its own gradient buffers. On a GPU the replayed steps give the plain steps' losses and
weights, and a parameter replaced by another array is captured again; on the fake CuPy, which
cannot capture, the steps fall back to plain runs (said once) with the same results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mixrt
from mixrt import random as mixrt_random
from mixrt.errors import InputError
from mixrt.gluon import Trainer
from mixrt.module import Module
from mixrt.ops.device import gpu_available, to_host
from test_cudnn_conv import _small_convnet

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(23)


def _trained(cuda_graph: bool, steps: int = 4, replace_at: int | None = None):
    x = RNG.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = RNG.integers(0, 10, 8).astype(np.int64)
    mixrt_random.seed(7)
    model = Module.from_symbol(_small_convnet(), device="gpu")
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.05,
                                                        "momentum": 0.9})
    on_gpu = mixrt.gpu(0).device.put
    x, y = on_gpu(x), on_gpu(y)
    losses = []
    for step in range(steps):
        if step == replace_at:  # a new array for one weight: the graph must read it
            param = model.params["fc_weight"]
            param.set_data(to_host(param.raw()).copy())
        losses.append(model.train_step(x, y, trainer, cuda_graph=cuda_graph)[0])
    weights = {name: to_host(p.raw()) for name, p in model.params.items()}
    return losses, weights, model


@needs_gpu
@pytest.mark.parametrize("replace_at", [None, 2])
def test_captured_steps_train_as_plain_steps_do(replace_at):
    import cupy  # noqa: PLC0415
    RNG.bit_generator.state = np.random.default_rng(23).bit_generator.state
    plain_losses, plain_weights, _ = _trained(False, replace_at=replace_at)
    RNG.bit_generator.state = np.random.default_rng(23).bit_generator.state
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, weights, model = _trained(True, replace_at=replace_at)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for name, value in plain_weights.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    (program,) = model._programs.values()
    captures = program.session._captures
    fallbacks = [str(c.message) for c in caught if "without a CUDA graph" in str(c.message)]
    if getattr(cupy, "IS_FAKE", False):  # it cannot capture: one fallback, said once
        assert len(captures.failed) == 1 and len(fallbacks) == 1
        assert "cannot capture" in fallbacks[0]
    else:
        assert not captures.failed and not fallbacks and len(captures.runs) == 1
        (run,) = captures.runs.values()
        # the weights and the running statistics a step updates (BatchNormalization's) are
        # read where they are; nothing else is
        assert run.in_place == frozenset(program.trainable) | model._state_feeds().keys()
        assert model._state_feeds()  # the convnet has BatchNormalizations
        assert run.inputs["fc_weight"].data.ptr == model.params["fc_weight"].raw().data.ptr


def test_a_cpu_program_refuses_cuda_graphs():
    from helpers import mlp_graph  # noqa: PLC0415
    model = Module(mlp_graph())
    trainer = Trainer(model.params.trainable(), "sgd")
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(InputError, match="cuda_graph=True"):
        model.train_step(x, np.zeros(4, np.int64), trainer, cuda_graph=True)


@needs_gpu
def test_a_gpu_training_run_reads_back_only_its_checks_once():
    """Reading a device value to the host waits for the GPU and cannot be recorded in a CUDA
    graph: the forward and backward of a step (softmax cross-entropy's class check and its
    gradient's mean included) read back only the run's deferred checks, together."""
    import cupy  # noqa: PLC0415
    if not getattr(cupy, "IS_FAKE", False):
        pytest.skip("counts the fake CuPy's reads back: fake CuPy only")
    _, _, model = _trained(False, steps=2)
    (program,) = model._programs.values()
    on_gpu = mixrt.gpu(0).device.put
    feeds = program._feeds(model.params.arrays(), {
        "data": on_gpu(RNG.standard_normal((8, 1, 8, 8)).astype(np.float32)),
        program.loss_spec.label: on_gpu(RNG.integers(0, 10, 8)), **model._state_feeds()})
    before = cupy._core.host_reads()
    program.session.run_on_device([program.loss, *program._grad_names], feeds)
    assert cupy._core.host_reads() - before == 1


@needs_gpu
def test_a_bad_class_in_a_gpu_step_is_named_after_the_run():
    """On a GPU the deferred check names the loss node once the run is done (CuPy's pick
    itself would wrap the class around); the fake's NumPy pick refuses it at once."""
    from mixrt.errors import ExecutionError  # noqa: PLC0415
    _, _, model = _trained(False, steps=1)
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.05})
    x = RNG.standard_normal((4, 1, 8, 8)).astype(np.float32)
    with pytest.raises(ExecutionError, match=r"node 'loss'.*(every target class in \[0, 10\)"
                                             r"|index 10 is out of bounds)"):
        model.train_step(x, np.array([1, 2, 10, 3]), trainer)


@needs_gpu
def test_fit_replays_its_steps():
    """Module.fit(cuda_graph=True): the epochs' steps replay (the fake CuPy falls back,
    saying so once), and the model learns as plain fitting does."""
    from mixrt.io import NDArrayIter  # noqa: PLC0415
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(64, -1).mean(axis=1) > 0).astype(np.int64)
    histories = {}
    for replayed in (False, True):
        mixrt_random.seed(5)
        model = Module.from_symbol(_small_convnet(), device="gpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            histories[replayed] = model.fit(
                NDArrayIter(x, y, 16), optimizer="sgd", epochs=2, progress=False,
                optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
                cuda_graph=replayed)
    for plain, replayed in zip(histories[False], histories[True]):
        np.testing.assert_allclose(replayed["loss"], plain["loss"], rtol=1e-4)
