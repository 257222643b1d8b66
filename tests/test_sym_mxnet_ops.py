"""MXNet's function names in a hybridized block (``F.broadcast_add``, ``F.slice_axis``,
``F.topk``, ... through mixrt/sym/mxnet_ops.py).

Every case of tests/test_nd_mxnet_ops.py (values and gradients that MXNet 1.9.1 produced)
runs again with each ``nd.<function>(...)`` call made inside a hybridized HybridBlock: its
array arguments become the block's inputs, ``F.<function>`` is called on their Symbols, and
the traced graph runs (under ``autograd.record()`` its backward is the graph's). The results
must be MXNet's again.
"""

from __future__ import annotations

import numpy as np
import pytest

import mixrt  # noqa: F401
import test_nd_mxnet_ops as cases
from mixrt import autograd, gluon, nd, sym
from mixrt.errors import HybridizeError


class _OneCall(gluon.HybridBlock):
    """``F.<name>(*args, **kwargs)`` with the arrays among them as the block's inputs."""

    def __init__(self, name: str, args, kwargs, slots: list):
        super().__init__()
        self._call = (name, args, kwargs, slots)

    def hybrid_forward(self, F, *arrays):
        name, args, kwargs, slots = self._call
        args, kwargs = _filled((list(args), dict(kwargs)), slots, arrays)
        out = getattr(F, name)(*args, **kwargs)
        return tuple(out) if isinstance(out, list) else out


def _arrays_in(value, path=(), found=None):
    """(path, NDArray) of every array inside nested lists, tuples and dicts."""
    found = [] if found is None else found
    if isinstance(value, nd.NDArray):
        found.append((path, value))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _arrays_in(item, path + (i,), found)
    elif isinstance(value, dict):
        for key, item in value.items():
            _arrays_in(item, path + (key,), found)
    return found


def _filled(value, slots: list, arrays):
    """``value`` with the array at each slot's path replaced by the matching input."""
    value = _copied(value)
    for path, array in zip(slots, arrays):
        holder = value
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = array
    return value


def _copied(value):
    if isinstance(value, (list, tuple)):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


class _Hybridizing:
    """Stands in for ``mixrt.nd`` in the cases: each MXNet function call runs hybridized."""

    def __getattr__(self, name):
        real = getattr(nd, name)
        if name not in sym.MXNET_FUNCTIONS and name not in ("FullyConnected", "Activation",
                                                             "LeakyReLU", "Embedding"):
            return real

        def hybridized(*args, **kwargs):
            found = _arrays_in((list(args), kwargs))
            block = _OneCall(name, args, kwargs, [path for path, _ in found])
            block.hybridize()
            out = block(*[array for _, array in found])
            assert block._cached, f"{name} did not run traced"
            return list(out) if isinstance(out, tuple) else out
        return hybridized


@pytest.fixture
def hybridized_calls(monkeypatch):
    monkeypatch.setattr(cases, "nd", _Hybridizing())


# take(mode='raise') reads the indices' values: a traced graph has none (tested below)
NEEDS_VALUES = {"take_raise"}


@pytest.mark.parametrize("name", sorted(set(cases.EXPECTED) - NEEDS_VALUES))
def test_every_case_hybridized_gives_mxnets_values_and_gradients(name, hybridized_calls):
    got = cases._flatten(getattr(cases, f"_case_{name}")())
    expected = cases._flatten(cases.EXPECTED[name])
    assert len(got) == len(expected)
    for array, (shape, dtype, values) in zip(got, expected):
        assert array.shape == shape and str(array.dtype) == dtype, name
        np.testing.assert_allclose(array.asnumpy(), np.array(values, dtype=dtype).reshape(shape),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_every_mxnet_function_is_a_symbol_function():
    from mixrt.nd import mxnet_ops  # noqa: PLC0415
    assert all(hasattr(sym, name) for name in mxnet_ops.FUNCTIONS)
    assert all(hasattr(sym.Symbol, name) for name in mxnet_ops.METHODS)


class _Mixed(gluon.HybridBlock):
    """The common MXNet idioms in one hybrid_forward, methods included."""

    def hybrid_forward(self, F, x, y):
        total = F.broadcast_add(x, F.slice_axis(y, axis=0, begin=0, end=1))
        top = total.topk(axis=1, k=2, ret_typ="value")
        parts = F.split(total, num_outputs=2, axis=1)
        mask = F.broadcast_greater(x, y.slice_axis(axis=0, begin=1, end=2))
        product = F.batch_dot(top.expand_dims(1), parts[1].expand_dims(2)).reshape((-1, 1))
        return F.Concat(F.BlockGrad(parts[0]) * 2 + product, mask * F.round(x * 2), axis=1)


def test_a_block_of_mxnet_idioms_matches_imperative_and_exports(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    x = nd.array(rng.standard_normal((3, 4)).astype(np.float32))
    y = nd.array(rng.standard_normal((2, 4)).astype(np.float32))
    block = _Mixed()
    runs = []
    for hybrid in (False, True):
        block.hybridize(hybrid)
        for a in (x, y):
            a.attach_grad()
        with autograd.record():
            out = block(x, y)
            (out * out).sum().backward()
        runs.append([out.asnumpy(), x.grad.asnumpy().copy(), y.grad.asnumpy().copy()])
    for got, want in zip(*runs):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    paths = block.export(str(tmp_path / "mixed"))
    session = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    got = session.run(None, {"data0": x.asnumpy(), "data1": y.asnumpy()})[0]
    np.testing.assert_allclose(got, runs[0][0], rtol=1e-5, atol=1e-6)


def test_a_function_that_needs_values_names_the_block_and_line():
    class Raising(gluon.HybridBlock):
        def hybrid_forward(self, F, x, index):
            return F.take(x, index, mode="raise")

    block = Raising()
    block.hybridize()
    with pytest.raises(HybridizeError, match=r"Raising .*test_sym_mxnet_ops.py"):
        block(nd.ones((3, 2)), nd.array([0, 2]))
