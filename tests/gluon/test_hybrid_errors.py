"""The messages the imperative issue promises: hybridize with data-dependent control flow,
stale gradients at Trainer.step, and the profiler seeing imperative and hybridized code."""

import json

import mixrt  # noqa: F401,I001
import numpy as np
import pytest

from mixrt import autograd, gluon, nd, profiler
from mixrt.errors import DeviceUnavailableError, GradientError, HybridizeError
from mixrt.gluon import nn


class BranchOnValue(gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        if x.sum() > 0:  # the line the error must point at
            return x
        return -x


class FloatOfValue(gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return x * float(x.max())


def _x():
    return nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))


def test_branching_on_a_traced_value_names_block_line_and_fix():
    block = BranchOnValue()
    assert block(_x()).shape == (2, 3)  # imperative: fine
    block.hybridize()
    with pytest.raises(HybridizeError) as caught:
        block(_x())
    message = str(caught.value)
    assert "BranchOnValue" in message and block.name in message
    assert "test_hybrid_errors.py" in message and "if x.sum() > 0:" in message
    assert "F.Where" in message and "hybridize()" in message


def test_reading_a_traced_value_as_a_number_is_refused():
    block = FloatOfValue()
    block.hybridize()
    with pytest.raises(HybridizeError, match="float\\(\\)"):
        block(_x())


def test_a_symbol_outside_tracing_is_not_silently_truthy():
    x = mixrt.sym.Variable("x")
    with pytest.raises(mixrt.errors.GraphError, match="Python bool"):
        bool(x)
    with pytest.raises(mixrt.errors.GraphError, match="NumPy"):
        np.asarray(x)


def test_trainer_refuses_a_parameter_backward_did_not_reach():
    used, unused = nn.Dense(3, in_units=4), nn.Dense(3, in_units=4)
    for block in (used, unused):
        block.initialize()
    params = {**used.collect_params(), **unused.collect_params()}
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = used(nd.ones((2, 4))).sum()
    loss.backward()
    with pytest.raises(GradientError) as caught:
        trainer.step(2)
    assert unused.weight.name in str(caught.value) and "ignore_stale_grad" in str(caught.value)
    before = unused.weight.data().asnumpy()
    trainer.step(2, ignore_stale_grad=True)
    np.testing.assert_array_equal(unused.weight.data().asnumpy(), before)
    assert not np.array_equal(used.weight.data().asnumpy(), np.zeros((3, 4)))


def test_profiler_traces_imperative_and_hybridized_code(tmp_path):
    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=3, activation="relu"))
    net.initialize()
    path = tmp_path / "trace.json"
    profiler.set_config(filename=str(path), profile_all=True)
    profiler.set_state("run")
    try:
        net(_x())
        net.hybridize()
        net(_x())
    finally:
        profiler.set_state("stop")
    profiler.dump()
    events = json.loads(path.read_text())["traceEvents"]
    categories = {e.get("cat") for e in events}
    assert {"imperative", "symbolic"} <= categories
    assert any(e["name"] == "Gemm" and e.get("cat") == "imperative" for e in events)
    assert any(e.get("ph") == "C" and e["name"].startswith("memory:") for e in events)


@pytest.mark.gpu  # without a GPU it checks the refusal; on one (or the fake), the figures
def test_gpu_memory_info_without_a_gpu_says_why():
    if mixrt.ops.device.gpu_available():
        free, total = mixrt.context.gpu_memory_info(0)
        assert 0 < free <= total
        return
    with pytest.raises(DeviceUnavailableError, match="GPU|CuPy"):
        mixrt.context.gpu_memory_info(0)
