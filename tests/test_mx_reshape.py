"""MXNet's reshape codes in symbols and hybridized blocks: mixrt::MXReshape
(ops/shape/shape_mxnet.py).

Before, a symbol refused -2/-3/-4 and reverse=True (a hybridized ``x.reshape(0, -3, 0)``
was a GraphError), so a block written for MXNet could not hybridize. The expected shapes
below are MXNet 1.9.1's (``mx.nd.zeros(shape).reshape(codes, reverse=...)``); None where
MXNet raises.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mixrt  # noqa: F401  (before NumPy's heavy use: it picks the BLAS kernels)
from mixrt import autograd, gluon, nd, sym
from mixrt.errors import ExecutionError, GraphError, InputError, ShapeError
from mixrt.ops.shape.shape_mxnet import mxnet_shape
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import Session

MXNET = [
    ((2, 3, 4, 5), (0, -3, 0), False, (2, 12, 5)),
    ((2, 3, 4, 5), (-4, 1, 2, -2), False, (1, 2, 3, 4, 5)),
    ((2, 3, 4, 5), (-4, -1, 2, -2), False, (1, 2, 3, 4, 5)),
    ((2, 3, 4, 5), (0, -1), True, (4, 30)),
    ((2, 3, 4, 5), (-3, -1), True, (12, 10)),
    ((2, 3, 4, 5), (-1, 5), True, (24, 5)),
    ((2, 3, 4, 5), (2, -4, 3, -1, -3), False, (2, 3, 1, 20)),
    ((2, 3, 4, 5), (-1, 0, 0), True, (6, 4, 5)),
    ((2, 3, 4, 5), (6, -1), True, (6, 20)),
    ((2, 3, 4, 5), (-3, -3), False, (6, 20)),
    ((2, 3, 4, 5), (-3, -3), True, (6, 20)),
    ((2, 3, 4, 5), (0, -4, -1, 1, -2), False, (2, 3, 1, 4, 5)),
    ((2, 3, 4, 5), (-2, -4, 1, -1), True, None),
    ((2, 3, 4, 5), (-4, 2, 1, -4, 3, 1, -2), False, (2, 1, 3, 1, 4, 5)),
    ((6, 4), (-4, 2, 3, -4, 2, 2), False, (2, 3, 2, 2)),
    ((6, 4), (-4, 2, 3, -4, 2, 2), True, None),
    ((6, 4), (-4, -1, 3, 0), True, None),
    ((6, 4), (0, -4, 2, -1), True, None),
    ((2, 3, 4, 5), (-3, -2), True, None),
    ((2, 3, 4, 5), (1, -2), False, None),
    ((2, 3, 4, 5), (0, 0, -3), True, (2, 3, 20)),
    ((2, 3, 4, 5), (-1,), False, (120,)),
    ((2, 3, 4, 5), (-3, 0, 0), False, (6, 4, 5)),
    ((8,), (-4, 2, -1), False, (2, 4)),
    ((8,), (-4, 2, -1), True, None),
    ((3, 1, 4), (-4, 1, 3, -2), False, (1, 3, 1, 4)),
    ((2, 3, 4, 5), (-1, -1), False, None),
    ((2, 3, 4, 5), (-4, 4, -1, -2), False, None),
    ((2, 3, 4, 5), (0, 0, 0, 0, 0), False, None),
    ((2, 3, 4, 5), (-3, -3, -3), False, None),
    ((2, 3, 4, 5), (-4, -1, -1, -2), False, None),
    ((2, 3, 4, 5), (7, -1), False, None),
    ((2, 3, 4, 5), (-5,), False, None),
    ((2, 3, 4, 5), (-4, 2), False, None),
]
VALID = [case for case in MXNET if case[3] is not None]
INVALID = [case for case in MXNET if case[3] is None]


def counting(shape) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


def symbol_reshape(shape, codes, reverse, dtype="float32"):
    return sym.Variable("x", shape=shape, dtype=dtype).reshape(codes, reverse=reverse)


# -- the rules, as MXNet has them ---------------------------------------------------------------

@pytest.mark.parametrize("shape, codes, reverse, expected", MXNET)
def test_the_rules_give_mxnets_shape_or_refuse(shape, codes, reverse, expected):
    if expected is None:
        with pytest.raises(ValueError, match="cannot reshape"):
            mxnet_shape(shape, codes, reverse)
    else:
        assert mxnet_shape(shape, codes, reverse) == expected


@pytest.mark.parametrize("shape, codes, reverse, expected", VALID)
def test_a_symbol_runs_mxnets_codes(shape, codes, reverse, expected):
    y = symbol_reshape(shape, codes, reverse)
    assert y.infer_shape()[1] == [expected]
    plain = not reverse and min(codes) >= -1 and codes.count(-1) <= 1
    assert any(node.op_type == "MXReshape" for node in y.to_graph().nodes) != plain
    got = Session(y.to_graph()).run(None, {"x": counting(shape)})[0]
    np.testing.assert_array_equal(got, counting(shape).reshape(expected))


@pytest.mark.parametrize("shape, codes, reverse, expected", INVALID)
def test_a_symbol_with_codes_that_do_not_fit_is_refused_naming_the_node(shape, codes,
                                                                        reverse, expected):
    with pytest.raises((GraphError, ShapeError), match="reshape"):
        symbol_reshape(shape, codes, reverse).infer_shape()
    with pytest.raises(InputError, match="reshape"):
        nd.array(counting(shape)).reshape(codes, reverse=reverse)


def test_a_shape_not_known_until_it_runs_is_checked_when_it_runs():
    y = sym.Variable("x").reshape(-4, 4, -1, -2)
    graph = y.to_graph()
    with pytest.raises(ExecutionError, match=r"mxreshape.*-4 splits dimension 2 into 4 x 0"):
        Session(graph).run(None, {"x": counting((2, 3))})


def test_plain_targets_stay_onnx_reshape():
    y = symbol_reshape((2, 3, 4), (0, -1), False)
    assert [node.op_type for node in y.to_graph().nodes] == ["Reshape"]


def test_the_shape_keyword_as_in_mxnet():
    y = sym.reshape(sym.Variable("x", shape=(2, 3, 4, 5)), shape=(-1, 0), reverse=True)
    assert y.infer_shape()[1] == [(24, 5)]
    assert sym.Variable("x", shape=(2, 3)).reshape(shape=(3, 2)).infer_shape()[1] == [(3, 2)]


# -- symbolic dims --------------------------------------------------------------------------

@pytest.mark.parametrize("codes, reverse, expected", [
    ((0, -3, 0), False, ("batch", 12, 5)),
    ((0, -1), False, ("batch", 60)),          # the symbolic dim cancels out
    ((-3, -2), False, (None, 4, 5)),          # batch x 3 has no name
    ((-1, 0, 0), True, (None, 4, 5)),
    ((-4, -1, 2, -2), False, (None, 2, 3, 4, 5)),
    ((0, 0, -3), True, ("batch", 3, 20)),
])
def test_inference_keeps_what_it_can_of_a_symbolic_batch(codes, reverse, expected):
    graph = symbol_reshape((None, 3, 4, 5), codes, reverse).to_graph()
    graph.inputs[0].type = TensorType(np.dtype(np.float32), ("batch", 3, 4, 5))
    assert infer_types(graph)[graph.outputs[0].name].shape == expected


# -- hybridized blocks: same outputs and gradients, exports that run elsewhere --------------------

class Regroup(gluon.HybridBlock):
    """MXNet idioms: merge channels into rows, split them again, match from the right."""

    def __init__(self):
        super().__init__()
        self.dense = gluon.nn.Dense(6, flatten=False)

    def hybrid_forward(self, F, x):
        merged = x.reshape(0, -3, -2)                  # (n, 3*4, 5)
        scaled = self.dense(merged)                    # (n, 12, 6)
        split = scaled.reshape(0, -4, 3, -1, -2)       # (n, 3, 4, 6)
        return F.reshape(split, shape=(-1, 6), reverse=True).tanh()  # (n*12, 6)


def trained_block(hybrid: bool, data: np.ndarray):
    mixrt.random.seed(3)
    block = Regroup()
    block.initialize()
    if hybrid:
        block.hybridize()
    x = nd.array(data)
    x.attach_grad()
    with autograd.record():
        y = block(x)
        loss = (y * y).sum()
    loss.backward()
    return block, y.asnumpy(), x.grad.asnumpy(), block.dense.weight.grad().asnumpy()


def test_a_hybridized_block_with_mxnet_codes_matches_the_imperative_one():
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    _, *imperative = trained_block(False, data)
    _, *hybridized = trained_block(True, data)
    assert imperative[0].shape == (24, 6)
    for got, want in zip(hybridized, imperative):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_the_export_runs_in_onnxruntime_at_other_batch_sizes(tmp_path, opset):
    data = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    block, _, _, _ = trained_block(True, data)
    paths = block.export(str(tmp_path / "regroup"))
    from mixrt.exporters.onnx import save_model  # noqa: PLC0415
    graph = block._last_cached.inference_graph()
    save_model(graph, tmp_path / "at.onnx", opset)
    model = onnx.load(tmp_path / "at.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert not any(node.domain == "mixrt" for node in model.graph.node)
    bigger = np.random.default_rng(2).standard_normal((5, 3, 4, 5)).astype(np.float32)
    want = block(nd.array(bigger)).asnumpy()
    ort_session = ort.InferenceSession(str(tmp_path / "at.onnx"))
    got = ort_session.run(None, {ort_session.get_inputs()[0].name: bigger})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    from_mxr = Session(paths["mxr"]).run(None, {"data": bigger})[0]
    np.testing.assert_allclose(from_mxr, want, rtol=1e-5, atol=1e-6)


def _empty_variants(shape):
    """The shape itself and, for each dim, the shape with that dim 0."""
    return [tuple(shape)] + [tuple(0 if i == at else d for i, d in enumerate(shape))
                             for at in range(len(shape))]


@pytest.mark.parametrize("opset", [13, 17])
def test_exports_reshape_empty_tensors_as_mixrt_does(tmp_path, opset):
    """ONNX Reshape reads a 0 in its target as "copy the input's dim here", so a merged,
    split or moved dim that is 0 at run time used to be misread (onnxruntime refused
    (2, 3, 0, 5) under (-3, 0, 0)). Every code list, with each dim 0 in turn, against
    mixrt's own kernel, in onnxruntime and in mixrt importing the export."""
    from mixrt.exporters.onnx import save_model  # noqa: PLC0415
    from mixrt.importers.onnx import import_model  # noqa: PLC0415
    checked = 0
    for k, (shape, codes, reverse, _) in enumerate(VALID):
        graph = sym.Variable("x", shape=(None,) * len(shape), dtype="float32").reshape(
            codes, reverse=reverse).to_graph()
        path = tmp_path / f"case{k}.onnx"
        save_model(graph, path, opset)
        ort_session = ort.InferenceSession(str(path))
        reimported = Session(import_model(str(path)))
        for variant in _empty_variants(shape):
            x = counting(variant)
            try:
                want = Session(graph).run(None, {"x": x})[0]
            except ExecutionError:
                continue  # MXNet's rules refuse this shape (a -4 that no longer fits)
            for got in (ort_session.run(None, {"x": x})[0],
                        reimported.run(None, {"x": x})[0]):
                assert got.shape == want.shape, (shape, codes, reverse, variant)
                np.testing.assert_array_equal(got, want)
            checked += 1
    assert checked >= 70  # 21 code lists, most with several empty variants


def test_export_needs_the_rank():
    from mixrt.errors import ExportError  # noqa: PLC0415
    from mixrt.exporters.onnx import export_model  # noqa: PLC0415
    with pytest.raises(ExportError, match="rank"):
        export_model(sym.Variable("x", dtype="float32").reshape(0, -3).to_graph(), 17)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_a_hybridized_block_with_mxnet_codes_on_the_gpu():
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    mixrt.random.seed(3)
    block = Regroup()
    block.initialize(ctx=mixrt.gpu(0))
    block.hybridize()
    got = block(nd.array(data, ctx=mixrt.gpu(0)))
    assert got.ctx == mixrt.gpu(0)
    _, want, _, _ = trained_block(False, data)
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
