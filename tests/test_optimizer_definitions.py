"""One optimizer, one definition: each file of ``runtime/training/optimizers/`` is an
optimizer, and its nd operators, its engine kind and its MXNet-style class are made from
it or read it. Adding an optimizer is adding its file (the last test adds one)."""

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mixrt import nd, optimizer, optimizer_ops
from mixrt.base.errors import OptimizerError
from mixrt.runtime.training import optimizer as engine
from mixrt.runtime.training.optimizers import definitions, engine_kinds

DEFINITIONS = sorted(definitions().values(), key=lambda d: d.name)


def test_the_package_holds_mxnets_and_pytorchs_optimizers():
    assert sorted(definitions()) == ["adagrad", "adam", "ftml", "ftrl", "groupadagrad",
                                     "lamb", "rmsprop", "sgd", "signum"]
    assert sorted(engine_kinds()) == sorted(engine.OPTIMIZERS) == [
        "adagrad", "adam", "adamw", "lamb", "mxnet_adagrad", "mxnet_adam", "mxnet_ftrl",
        "mxnet_lamb", "mxnet_rmsprop", "mxnet_sgd", "mxnet_signum", "rmsprop", "sgd"]


@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.name for d in DEFINITIONS])
def test_each_definitions_operators_are_nd_functions_with_mxnets_signature(definition):
    for declared in definition.operators:
        function = getattr(optimizer_ops, declared.name)  # one_multi_*: not MXNet's names
        if not declared.name.startswith("one_"):
            assert getattr(nd, declared.name) is function
        assert inspect.signature(function) == declared.signature()
        if declared.multi:
            assert callable(getattr(nd, declared.multi))


@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.name for d in DEFINITIONS])
def test_each_definitions_mxnet_class_reads_it(definition):
    klass = optimizer.Optimizer.opt_registry.find(definition.name)
    assert klass.definition is definition
    if definition.engine_name:
        kind = engine.OPTIMIZERS[definition.engine_name]
        assert kind.definition is definition
        assert kind.default_learning_rate == definition.default_learning_rate


@pytest.mark.parametrize("name, options, layout", [
    ("adam", {}, (2,)), ("rmsprop", {}, (1,)), ("rmsprop", {"centered": True}, (3,)),
    ("adagrad", {}, None), ("signum", {}, None), ("signum", {"momentum": 0.0}, "none"),
    ("ftrl", {}, (2,)), ("ftml", {}, (3,)), ("lamb", {}, (2,))])
def test_an_mxnet_class_state_is_its_definitions_slots_in_mxnets_layout(name, options,
                                                                         layout):
    state = optimizer.create(name, **options).create_state(0, nd.zeros((2, 3)))
    if layout == "none":
        assert state is None
    elif layout is None:
        assert isinstance(state, nd.NDArray) and state.shape == (2, 3)
    else:
        assert isinstance(state, tuple) and len(state) == layout[0]
        assert all(s.shape == (2, 3) for s in state)


def test_an_engine_kind_checks_its_definitions_ranges_and_names_them():
    with pytest.raises(OptimizerError, match="beta1"):
        engine.create("mxnet_adam", beta1=1.0)
    with pytest.raises(OptimizerError, match="clip_weights"):
        engine.create("mxnet_rmsprop", clip_weights=0.0)
    with pytest.raises(OptimizerError, match="no parameter 'gamma3'"):
        engine.create("mxnet_rmsprop", gamma3=0.5)
    assert engine.create("mxnet_lamb", lower_bound=0).lower_bound is None  # MXNet's "unset"


# -- a new optimizer, added as one file ----------------------------------------------------

TOY = '''
"""A toy optimizer: a decaying sum of gradients."""
from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, common)

RULE = rules.Rule("toy", ("weight", "acc"), ("grad",), ("lr", "wd", "decay", "rescale_grad"),
                  ("acc = decay * acc + rescale_grad * grad + wd * weight",
                   "weight = weight - lr * acc"))


def _step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(RULE, xp, weight, reads["grad"], states, **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    return _step(xp, weight, {"grad": grad}, state,
                 dict(lr=lr, wd=wd, decay=kind.decay, **common(kind)), True)


DEFINITION = Definition(
    name="toy", hyper=(Hyper.real("decay", 0.5, low=0.0, high=1.0),),
    slots=lambda hyper: ("acc",), step=_engine_step, default_learning_rate=0.1,
    operators=(Operator("toy_update", ("acc",), (("lr", REQUIRED), ("decay", 0.5),
                                                 ("wd", 0.0), *GRADIENT), _step),))
'''

SCRIPT = '''
import json, sys
import numpy as np
import mixrt.runtime.training.optimizers as package
package.__path__.append(sys.argv[1])  # as if toy.py were a file of the package
from mixrt import nd, optimizer, optimizer_ops
from mixrt.base.errors import OptimizerError
from mixrt.runtime.training import optimizer as engine

grads = [np.array([0.5, -1.0, 2.0], "f"), np.array([1.5, 0.25, -0.5], "f")]
start = np.array([1.0, 2.0, 3.0], "f")

w, acc = nd.array(start), nd.zeros((3,))
for g in grads:
    nd.toy_update(w, nd.array(g), acc, lr=0.1, decay=0.25, wd=0.01, out=w)

mxnet = optimizer.create("toy", decay=0.25, wd=0.01)
updater, w2 = optimizer.get_updater(mxnet), nd.array(start)
for g in grads:
    updater(0, nd.array(g), w2)

kind = engine.from_spec(json.loads(json.dumps(mxnet.spec())))
w3 = start.copy()
for g in grads:
    kind.step("w", w3, g)
try:
    optimizer.create("toy", decay=2.0)
    refused = ""
except OptimizerError as error:
    refused = str(error)
print(json.dumps({"op": w.asnumpy().tolist(), "class": w2.asnumpy().tolist(),
                  "server": w3.tolist(), "spec": mxnet.spec()["name"], "refused": refused}))
'''


def test_a_new_optimizer_is_one_file(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, MIXRT_JIT="0"))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    weight, acc = np.array([1.0, 2.0, 3.0], "f"), np.zeros(3, "f")
    for g in ([0.5, -1.0, 2.0], [1.5, 0.25, -0.5]):
        acc = np.float32(0.25) * acc + np.array(g, "f") + np.float32(0.01) * weight
        weight = weight - np.float32(0.1) * acc
    np.testing.assert_allclose(found["op"], weight, rtol=1e-6)
    assert found["class"] == found["op"] == found["server"]  # one rule: the same bits
    assert found["spec"] == "mxnet_toy"
    assert "decay" in found["refused"]

