"""The Trainer's communication through the dependency engine: same updates as without a
store, and gradients summed while backward is still running (MXNet's overlap)."""

import mixrt  # noqa: F401,I001
import numpy as np
import pytest

from mixrt import autograd, gluon, nd


class _Mark(autograd.Function):
    """Identity whose backward notes when it ran (it is the first op: its backward is last)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def forward(self, x):
        return x * 1

    def backward(self, dy):
        self.log.append("backward reached the input")
        return dy


def _params(seed=0):
    rng = np.random.default_rng(seed)
    names = ("w1", "b1", "w2", "b2")
    shapes = ((8, 5), (8,), (3, 8), (3,))
    return [gluon.Parameter(n, rng.normal(size=s).astype(np.float32)) for n, s in
            zip(names, shapes)]


def _train(trainer, params, log=None, steps=3):
    rng = np.random.default_rng(1)
    for _ in range(steps):
        x = nd.array(rng.normal(size=(4, 5)).astype(np.float32))
        x.attach_grad()  # so the marker at the input is on the tape
        with autograd.record():
            h = _Mark(log)(x) if log is not None else x
            w1, b1, w2, b2 = (p.data() for p in params)
            h = nd.Relu(nd.Gemm(h, w1, b1, transB=1))
            loss = (nd.Gemm(h, w2, b2, transB=1) ** 2).sum()
        loss.backward()
        trainer.step(4)
    return [p.data().asnumpy() for p in params]


@pytest.mark.parametrize("update_on_kvstore", [False, True])
def test_engine_backed_store_updates_equal_the_plain_trainer(update_on_kvstore):
    plain, stored = _params(), _params()
    options = {"learning_rate": 0.05, "momentum": 0.9}
    expected = _train(gluon.Trainer(plain, "sgd", options), plain)
    got = _train(gluon.Trainer(stored, "sgd", options, kvstore="local",
                               update_on_kvstore=update_on_kvstore), stored)
    for a, b in zip(expected, got):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gradients_are_reduced_while_backward_still_runs():
    params, log = _params(), []
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05}, kvstore="local",
                            update_on_kvstore=False)
    queue = trainer._traffic.queue_reduce

    def noting(param):
        log.append(f"reduce {param.name}")
        queue(param)
    trainer._traffic.queue_reduce = noting
    _train(trainer, params, log, steps=2)
    second_step = log[log.index("backward reached the input") + 1:]
    # step 2: the output layer's gradients go to the store before backward reaches the input
    assert second_step.index("reduce w2") < second_step.index("backward reached the input")
    assert second_step.index("reduce b2") < second_step.index("backward reached the input")


def test_a_subclass_that_drops_the_store_after_init_steps_as_without_one():
    """MXNet's store attributes stay writable, as a Horovod-style subclass needs: it sums the
    gradients itself, so it sets ``_kvstore = None`` and ``_update_on_kvstore = False``
    after the Trainer's ``__init__``, and the steps are then the plain Trainer's."""
    class OwnReduction(gluon.Trainer):
        def __init__(self, params, *args, **kwargs):
            super().__init__(params, *args, kvstore="local", **kwargs)
            self._kvstore, self._update_on_kvstore = None, False

    plain, own = _params(), _params()
    options = {"learning_rate": 0.05, "momentum": 0.9}
    expected = _train(gluon.Trainer(plain, "sgd", options), plain)
    trainer = OwnReduction(own, "sgd", options)
    assert trainer.kvstore is None and trainer.update_on_kvstore is False
    got = _train(trainer, own)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    own[0]._trainer = None  # a Parameter's link to its Trainer is writable too
    assert own[0]._trainer is None
