"""gluon.Trainer as MXNet 1.9.1's: parameter order, MXNet's optimizers with live
multipliers, allreduce_grads/update, custom KVStores, learning-rate schedules. Expected
numbers are MXNet 1.9.1's for the same calls (worked out by its update rules, and checked
against it with one context)."""
import mixrt  # noqa: F401,I001
import numpy as np
import pytest
from helpers import counted_optimizer_launches
from mixrt import autograd, gluon, kv, lr_scheduler, nd
from mixrt.gluon.trainer import TrainerConfigError


def _zeros(name="x", shape=(4,)):
    param = gluon.Parameter(name, shape=shape)
    param.initialize(init="zeros")
    return param


def _backward_plus_one(param):
    with autograd.record():
        for w in param.list_data():
            (w + 1).backward()


def test_a_dict_of_parameters_is_taken_in_sorted_name_order():
    params = {"zeros_weight": _zeros("zeros_weight"), "ones_weight": _zeros("ones_weight")}
    trainer = gluon.Trainer(params, "sgd")
    assert [p.name for p in trainer._params] == ["ones_weight", "zeros_weight"]
    assert trainer._param2idx == {"ones_weight": 0, "zeros_weight": 1}


def test_a_named_optimizer_is_mxnets_and_follows_the_parameters_multipliers():
    x = _zeros()
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 1.0, "momentum": 0.5})
    assert isinstance(trainer._optimizer, mixrt.optimizer.SGD)
    assert trainer._optimizer.param_dict == {0: x}
    assert trainer._kvstore is None and trainer._update_on_kvstore is None
    _backward_plus_one(x)
    trainer.step(1)
    np.testing.assert_array_equal(x.data().asnumpy(), -1)
    x.lr_mult = 0.5  # set after the Trainer was made: still counts
    assert trainer._optimizer._get_lr(0) == 0.5
    _backward_plus_one(x)
    trainer.step(1)  # momentum 0.5 * -1 - 0.5 * 1
    np.testing.assert_array_equal(x.data().asnumpy(), -2)
    assert list(trainer._updaters[0].states) == [0]


def test_allreduce_grads_then_update_equals_step():
    x = _zeros()
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 0.5}, update_on_kvstore=False)
    _backward_plus_one(x)
    trainer.allreduce_grads()
    trainer.update(2)
    np.testing.assert_array_equal(x.data().asnumpy(), -0.25)
    with pytest.raises(Exception, match="no backward pass"):
        trainer.update(1)  # the gradient is stale now


def test_update_and_allreduce_are_refused_while_the_store_updates():
    x = _zeros()
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 0.1}, kvstore="local")
    assert trainer._update_on_kvstore is True
    _backward_plus_one(x)
    trainer.step(1)
    np.testing.assert_allclose(x.data().asnumpy(), -0.1, rtol=1e-6)
    with pytest.raises(AssertionError):
        trainer.update(1)
    with pytest.raises(AssertionError):
        trainer.allreduce_grads()


def test_mxnets_teststore_sums_gradients_and_refuses_to_run_the_optimizer():
    store = kv.create("teststore")
    assert isinstance(store, kv.KVStoreBase) and store.type == "teststore"
    assert isinstance(kv.create("local"), kv.KVStoreBase)
    x = _zeros()
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 1.0}, kvstore=store)
    assert trainer._update_on_kvstore is False
    _backward_plus_one(x)
    trainer.step(1)
    np.testing.assert_array_equal(x.data().asnumpy(), -1)
    refused = gluon.Trainer([x], "sgd", kvstore=store, update_on_kvstore=True)
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        refused._init_kvstore()
    with pytest.raises(TrainerConfigError):
        refused._init_kvstore()


def test_a_registered_store_class_is_made_by_name():
    @kv.KVStoreBase.register
    class SummingStoreForTests(kv.KVStoreBase):
        def broadcast(self, key, value, out, priority=0):
            for target in out:
                target[:] = value

        def pushpull(self, key, value, out=None, priority=0):
            for target in out:
                target[:] = target * 3  # visible: the Trainer used this store

        def is_capable(self, capability):
            return False

        @property
        def type(self):
            return "summingstorefortests"

    store = kv.create("summingstorefortests")
    assert isinstance(store, SummingStoreForTests)
    x = _zeros()
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 1.0}, kvstore=store)
    _backward_plus_one(x)
    trainer.step(1)
    np.testing.assert_array_equal(x.data().asnumpy(), -3)


def test_the_factor_schedule_gives_mxnets_rates_to_the_last_bit():
    x = _zeros()
    schedule = lr_scheduler.FactorScheduler(2, factor=0.1, base_lr=1)
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 1, "lr_scheduler": schedule})
    rates = []
    for _ in range(9):
        _backward_plus_one(x)
        trainer.step(1)
        rates.append(trainer.learning_rate)
    # MXNet multiplies its rate by the factor once per period: 0.1 * 0.1 * ... not 0.1 ** k
    assert rates[::2] == [1, 0.1, 0.010000000000000002, 0.0010000000000000002,
                          0.00010000000000000003]


def test_optimizer_states_save_and_load_keep_the_updaters_states(tmp_path):
    x = _zeros()
    trainer = gluon.Trainer([x], "adam", {"learning_rate": 0.1})
    _backward_plus_one(x)
    trainer.step(1)
    before = [s.asnumpy() for s in trainer._updaters[0].states[0]]
    trainer.save_states(tmp_path / "trainer.states")
    fresh = gluon.Trainer([x], "adam", {"learning_rate": 0.1})
    fresh.load_states(tmp_path / "trainer.states")
    _backward_plus_one(x)
    fresh.step(1)  # the loaded states move to the weight's context here
    after = [s.asnumpy() for s in fresh._updaters[0].states[0]]
    assert not np.array_equal(before[0], after[0])  # the moment advanced from the loaded one


def test_bad_arguments_are_refused_with_mxnets_error_types():
    with pytest.raises(ValueError, match="list or dict of Parameters"):
        gluon.Trainer("x", "sgd")
    with pytest.raises(ValueError, match="optimizer_params must be None"):
        gluon.Trainer([_zeros()], mixrt.optimizer.SGD(), {"learning_rate": 0.1})


def _sgd_trained(ctx, steps=3, **options):
    """Three weights (one with lr_mult and wd_mult) trained by MXNet's SGD through the
    Trainer on ``ctx``, with gradients of a fixed pattern: the weights after each step."""
    rng = np.random.default_rng(5)
    params = []
    for name, shape in (("a_weight", (3, 4)), ("b_bias", (4,)), ("c_weight", (2, 2, 3))):
        param = gluon.Parameter(name, shape=shape)
        param.initialize(init="zeros", ctx=ctx)
        param.set_data(nd.array(rng.standard_normal(shape), ctx=ctx))
        params.append(param)
    params[1].lr_mult, params[1].wd_mult = 0.5, 0.0
    trainer = gluon.Trainer(params, "sgd", options)
    history = []
    for step in range(steps):
        with autograd.record():
            for k, param in enumerate(params):
                w = param.data()
                ((w * w).sum() * (k + 1) + (w * (step + 1)).sum()).backward()
        trainer.step(4)
        history.append([p.data().asnumpy() for p in params])
    return history


@pytest.mark.gpu
@pytest.mark.parametrize("options", [
    {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "clip_gradient": 0.4},
    {"learning_rate": 0.05, "wd": 0.1}], ids=["momentum_clip", "plain"])
def test_mxnets_sgd_on_a_gpu_updates_every_weight_in_one_launch(options, monkeypatch):
    """Trainer(params, "sgd") on a GPU: each step's updates are one multi-tensor launch
    (runtime/training/optimizers/sgd.py's MXNet rule) and give the CPU's weights."""
    from mixrt.ops.device import gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU (or no CuPy)")
    launches = counted_optimizer_launches(monkeypatch)
    expected = _sgd_trained(mixrt.cpu(), **options)
    assert not launches
    got = _sgd_trained(mixrt.gpu(0), **options)
    assert launches == ["mixrt_mxnet_sgd_many"] * 3
    for step_got, step_expected in zip(got, expected):
        for mine, reference in zip(step_got, step_expected):
            np.testing.assert_allclose(mine, reference, rtol=2e-6, atol=2e-7)
