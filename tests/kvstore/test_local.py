"""The single-process kinds and the API every kind shares: create, keys, list aggregation,
updaters and optimizers, optimizer checkpoints, errors; the Trainer with a store."""

from __future__ import annotations

import numpy as np
import pytest

import mixrt
from mixrt.errors import KVStoreError, ShapeError
from mixrt.gluon import Parameter, Trainer
from mixrt.runtime.training import optimizer as optim


def test_create_knows_every_kind_and_refuses_others():
    assert mixrt.kv.create("local").type == "local"
    assert mixrt.kv.create("device").type == "device"
    with pytest.raises(KVStoreError, match="unknown KVStore kind 'dist'.*dist_sync"):
        mixrt.kv.create("dist")


def test_push_replaces_the_value_by_the_sum_of_a_list_without_updater():
    kv = mixrt.kv.create("local")
    kv.init(3, np.zeros((2, 2), np.float32))
    kv.push("3", [np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32)])  # 3 == "3"
    out = [np.empty((2, 2), np.float32), np.empty((2, 2), np.float32)]
    kv.pull(3, out=out)
    for array in out:
        np.testing.assert_array_equal(array, np.full((2, 2), 3))


def test_updater_and_optimizer_update_the_stored_weight():
    kv = mixrt.kv.create("local")
    kv.init(["a", "b"], [np.ones(3), np.zeros(2)])
    seen = []
    kv.set_updater(lambda key, grad, weight: (seen.append(key), weight.__isub__(grad)))
    kv.push(["a", "b"], [np.ones(3), np.ones(2)])
    assert seen == ["a", "b"]
    kv.set_optimizer(optim.create("sgd", learning_rate=0.5))
    out = np.empty(3)
    kv.pushpull("a", np.full(3, 2.0), out=out)
    np.testing.assert_array_equal(out, np.full(3, -1.0))  # 1 - 1 - 0.5 * 2


def test_optimizer_states_save_and_load_without_pickle(tmp_path):
    kv = mixrt.kv.create("local")
    kv.init("w", np.zeros(4))
    kv.set_optimizer(optim.create("adam", learning_rate=0.1))
    kv.push("w", np.ones(4))
    kv.save_optimizer_states(tmp_path / "s.npz")
    again = mixrt.kv.create("local")
    again.init("w", np.zeros(4))
    again.set_optimizer(optim.create("adam", learning_rate=0.1))
    again.load_optimizer_states(tmp_path / "s.npz")
    assert again.optimizer.counts == {"w": 1}
    saved, loaded = kv.optimizer.states["w"], again.optimizer.states["w"]
    assert set(saved) == set(loaded) == set(kv.optimizer.state_slots())
    for slot in saved:
        np.testing.assert_array_equal(loaded[slot], saved[slot])


@pytest.mark.parametrize("call,error,text", [
    (lambda kv: kv.push("nope", np.zeros(2)), KVStoreError, "'nope' was never initialized"),
    (lambda kv: kv.pull("w", out=np.zeros(3)), ShapeError, "shape \\(3,\\) does not match"),
    (lambda kv: kv.push("w", np.zeros(2, np.int32)), KVStoreError, "dtype int32"),
    (lambda kv: kv.init("w", np.zeros(2)), KVStoreError, "already initialized"),
    (lambda kv: kv.pull("w"), KVStoreError, "needs `out`"),
    (lambda kv: kv.push(["w", "w"], [np.zeros(2)]), KVStoreError, "2 keys need 2 values"),
    (lambda kv: kv.push(1.5, np.zeros(2)), KVStoreError, "int or a str"),
    (lambda kv: kv.set_optimizer("sgd"), KVStoreError, "mixrt optimizer"),
    (lambda kv: kv.save_optimizer_states("x.npz"), KVStoreError, "no optimizer"),
    (lambda kv: kv.set_gradient_compression({"type": "2bit"}), KVStoreError,
     "'device' and 'dist_\\*'"),
])
def test_bad_calls_name_the_key_and_what_was_expected(call, error, text):
    kv = mixrt.kv.create("local")
    kv.init("w", np.zeros(2))
    with pytest.raises(error, match=text):
        call(kv)


def _params():
    return [Parameter("w", np.ones(3, np.float32)), Parameter("b", np.zeros(1, np.float32))]


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_trainer_through_a_local_store_equals_the_trainer_without_one(update_on_kvstore):
    plain, stored = _params(), _params()
    trainers = [Trainer(plain, "sgd", {"learning_rate": 0.1, "momentum": 0.9}),
                Trainer(stored, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                        kvstore="local", update_on_kvstore=update_on_kvstore)]
    rng = np.random.default_rng(0)
    for _ in range(5):
        grads = [rng.standard_normal(3).astype(np.float32),
                 rng.standard_normal(1).astype(np.float32)]
        for params, trainer in zip((plain, stored), trainers):
            for param, grad in zip(params, grads):
                param.set_grad(grad)
            trainer.step(4)
    for a, b in zip(plain, stored):
        np.testing.assert_allclose(a.data(), b.data(), rtol=1e-6)
    state = trainers[1].optimizer_state_dict()
    assert "meta" in state and len([k for k in state if k != "meta"]) == 2


def test_trainers_sharing_a_store_keep_their_keys_apart():
    kv = mixrt.kv.create("local")
    first = Trainer(_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv, key_prefix="a/")
    second = Trainer(_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv, key_prefix="b/")
    for trainer in (first, second):
        for param in trainer.params:
            param.set_grad(np.ones(param.shape, np.float32))
        trainer.step()
    np.testing.assert_allclose(first.params[0].data(), np.full(3, 0.9))
    np.testing.assert_allclose(second.params[0].data(), np.full(3, 0.9))
