"""Shape inference is sound for every op the ONNX backend tests, and a model's declarations
cannot overrule it.

Soundness: each backend node case is run, and every value it makes must fit the type
inference gave it beforehand from the inputs alone: with the inputs fed (their values
unknown to inference), with the inputs as initializers (their values known, which exercises
the rules that compute shapes from constant data), and with every input dim a symbol (which
exercises how the rules carry symbols: one symbol must stand for one size). Where inference
knows a value's data before the run (a constant, shape arithmetic), the run must make that
very data: the optimizer folds it into the graph.

Declarations: a value_info, a graph output or a body may declare a type its values do not
have. Inference keeps its own answer where the two disagree (as onnxruntime does), so the
optimizer never removes a Reshape on the strength of a wrong declaration.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from mixrt.ops.compiled import jit_tier
from mixrt.ops.ir.types import UNKNOWN, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Node, Value
from mixrt.runtime.passes.infer import infer_node, infer_types, refined, without_body_declarations
from mixrt.runtime.session import Session, load_graph
from soundness import (backend_node_cases, case_inputs, fits, run_recording, stored_model_cases,
                       values_that_contradict)

F32 = np.dtype(np.float32)


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    """The runs here check inference against the values' types and shapes, which the NumPy
    kernels (``MIXRT_JIT=0``) make as the compiled ones do; compiling kernels for every
    backend case and model took ~200 of this file's ~230 s run alone."""
    monkeypatch.setenv("MIXRT_JIT", "0")


# -- every backend node case --------------------------------------------------------------

def _as_initializers(model: onnx.ModelProto, inputs: list) -> onnx.ModelProto | None:
    """The model with its inputs turned into initializers holding ``inputs``; None when an
    input is not a tensor (a sequence, an optional, a map) or has no TensorProto form."""
    if not all(isinstance(v, np.ndarray) and v.dtype != object for v in inputs):
        return None
    constant = onnx.ModelProto()
    constant.CopyFrom(model)
    names = [v.name for v in constant.graph.input]
    del constant.graph.input[:]
    try:
        constant.graph.initializer.extend(numpy_helper.from_array(v, n)
                                          for n, v in zip(names, inputs))
    except (TypeError, ValueError):
        return None
    constant.ir_version = max(constant.ir_version, 4)  # initializers need not be inputs
    return constant


def _contradictions(case, tmp_path, monkeypatch, mode: str):
    model, feeds = case.model, dict(zip([v.name for v in case.model.graph.input],
                                        case_inputs(case)))
    if mode == "constant":
        model, feeds = _as_initializers(model, list(feeds.values())), {}
        if model is None:
            return None
    path = tmp_path / f"{case.name}.onnx"
    onnx.save(model, str(path))
    # on the NumPy tier: a model of constants runs its first run's kernels compiled, in the
    # foreground (~30 s of numba for these cases), and the values' types are the tiers' same
    with warnings.catch_warnings(), jit_tier.using(False):
        warnings.simplefilter("ignore")  # cases that divide by zero on purpose
        if mode == "symbolic":
            return _symbolic_contradictions(path, feeds, monkeypatch)
        wrong, _ = values_that_contradict(path, feeds, monkeypatch)
    return wrong


def _symbolic_contradictions(path, feeds: dict, monkeypatch) -> dict:
    """Inference from inputs whose every dim is its own symbol: each number it derives
    must be right, and each symbol must stand for one size throughout the top level (a
    body value is seen once per iteration and may differ between them)."""
    graph = load_graph(str(path))
    symbols, inputs = {}, []
    for k, value in enumerate(graph.inputs):
        fed = feeds.get(value.name)
        if isinstance(fed, np.ndarray):
            dims = tuple(f"input{k}_dim{j}" for j in range(fed.ndim))
            symbols.update(zip(dims, fed.shape))
            value = Value(value.name, TensorType(fed.dtype, dims))
        inputs.append(value)
    graph.outputs = [Value(v.name, None) for v in graph.outputs]
    types = infer_types(without_body_declarations(replace(graph, inputs=inputs,
                                                          value_types={})))
    seen = run_recording(path, feeds, monkeypatch)
    return {name: (str(types.get(name)), [getattr(v, "shape", "?") for v in values][:3])
            for name, values in seen.items()
            if not all(fits(types.get(name), v) for v in values)
            or len(values) == 1 and not _binds(types.get(name), values[0], symbols)}


def _binds(value_type, value, symbols: dict) -> bool:
    """Whether the value's size for each symbolic dim is the one that symbol has had."""
    if not isinstance(value_type, TensorType) or value_type.shape is None or \
            not isinstance(value, np.ndarray):
        return True
    return all(symbols.setdefault(d, n) == n
               for d, n in zip(value_type.shape, value.shape) if isinstance(d, str))


@pytest.mark.parametrize("mode", ["fed", "constant", "symbolic"])
def test_every_backend_case_makes_values_that_fit_their_inferred_types(
        mode, tmp_path, monkeypatch):
    checked, unsound = 0, {}
    for case in backend_node_cases():
        wrong = _contradictions(case, tmp_path, monkeypatch, mode)
        if wrong is None:
            continue
        checked += 1
        if wrong:
            unsound[case.name] = wrong
    assert checked > 1500, f"only {checked} backend cases ran"
    assert not unsound, f"inference contradicted by the run: {unsound}"


@pytest.mark.parametrize("mode", ["fed", "symbolic", "optimized"])
def test_whole_models_make_values_that_fit_their_inferred_types(mode, monkeypatch):
    """The backend's stored models and the PyTorch exports: many nodes each, with the
    Shape-Gather-Concat-Reshape chains exporters write, checked value by value; optimized:
    the graph opt_level 2 makes (fused convolutions, elementwise chains) and its run."""
    checked, unsound = 0, {}
    for name, path, feeds in stored_model_cases():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrong = (_symbolic_contradictions(path, feeds, monkeypatch) if mode == "symbolic"
                     else values_that_contradict(path, feeds, monkeypatch,
                                                 2 if mode == "optimized" else 0)[0])
        checked += 1
        if wrong:
            unsound[name] = wrong
    assert checked >= 150, f"only {checked} models ran"
    assert not unsound, f"inference contradicted by the run: {unsound}"


# -- declarations do not overrule inference ----------------------------------------------

def _save(tmp_path, graph, opset=17):
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def _agrees_with_onnxruntime(path, feeds):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for level in (0, 1, 2):
        got = Session(str(path), opt_level=level).run(None, feeds)
        for a, b in zip(want, got):
            assert a.shape == b.shape, f"opt_level {level}"
            np.testing.assert_allclose(b, a, rtol=1e-6)


def test_a_wrong_value_info_does_not_make_a_reshape_look_like_a_no_op(tmp_path):
    """'a' is (1, 3) but declared (3,): trusting the declaration, the optimizer took
    Reshape(a, [3]) for a no-op and returned (1, 3)."""
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["a"]), h.make_node("Reshape", ["a", "s"], ["y"])], "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [numpy_helper.from_array(np.array([3], np.int64), "s")],
        value_info=[h.make_tensor_value_info("a", T.FLOAT, [3])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _agrees_with_onnxruntime(_save(tmp_path, graph), {"x": -np.ones((1, 3), np.float32)})


def test_a_body_declaring_a_wrong_shape_does_not_either(tmp_path):
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Add", ["s_in", "x"], ["a"]),
         h.make_node("Reshape", ["a", "flat"], ["s_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("s_in", T.FLOAT, [3])],
        [h.make_tensor_value_info("c_out", T.BOOL, []),
         h.make_tensor_value_info("s_out", T.FLOAT, [3])],
        [numpy_helper.from_array(np.array([3], np.int64), "flat")],
        value_info=[h.make_tensor_value_info("a", T.FLOAT, [3])])  # it is (1, 3)
    graph = h.make_graph(
        [h.make_node("Loop", ["M", "", "s0"], ["s"], body=body)], "g",
        [h.make_tensor_value_info("M", T.INT64, []), h.make_tensor_value_info("s0", T.FLOAT, [3]),
         h.make_tensor_value_info("x", T.FLOAT, [1, 3])],
        [h.make_tensor_value_info("s", T.FLOAT, None)])
    feeds = {"M": np.array(2), "s0": np.zeros(3, np.float32),
             "x": np.arange(3, dtype=np.float32).reshape(1, 3)}
    _agrees_with_onnxruntime(_save(tmp_path, graph), feeds)


# -- the rule that joins a declaration and inference --------------------------------------

@pytest.mark.parametrize("declared, inferred, joined", [
    ((3,), (1, 3), (1, 3)),                   # ranks differ: inference
    ((2, 5), (2, 3), (2, 3)),                 # numbers differ: inference
    (("batch", None), (None, 4), ("batch", 4)),  # each fills the other's gaps
    (("batch", 4), ("N", 4), ("batch", 4)),   # the model's name for a symbolic dim
    ((1, 4), ("N", 4), ("N", 4)),             # a number nothing checks against the input
    ((2, 3), None, (2, 3)),                   # inference knows no rank
])
def test_inference_wins_and_the_declaration_fills_its_gaps(declared, inferred, joined):
    assert refined(TensorType(F32, declared), TensorType(F32, inferred)).shape == joined


def test_an_unknown_inference_keeps_the_declaration_of_any_kind():
    declared = OptionalType(SequenceType(TensorType(F32, ())))
    assert refined(declared, UNKNOWN) == declared and refined(declared, None) == declared


def test_sequences_join_their_elements():
    joined = refined(SequenceType(TensorType(F32, ())), SequenceType(TensorType(F32, (5,))))
    assert joined == SequenceType(TensorType(F32, (5,)))


def test_the_dtype_inference_computes_wins():
    assert refined(TensorType(np.dtype(np.float64), (2,)), TensorType(F32, (2,))).dtype == F32


# -- an optional input that is present but untyped is not an absent one ------------------

def _dft(axis_name: str) -> Node:
    return Node("DFT", ["x", "", axis_name], ["y"], attributes={"onesided": 1}, opset=20)


def test_a_dft_axis_known_only_at_run_time_leaves_the_signal_dims_unknown():
    x = TensorType(F32, (1, 10, 8, 1))
    axis = TensorType(np.dtype(np.int64), ())
    assert infer_node(_dft("axis"), {"x": x, "axis": axis})[0].shape == (1, None, None, 2)
    constant = TensorType(np.dtype(np.int64), (), value=np.array(1))
    assert infer_node(_dft("axis"), {"x": x, "axis": constant})[0].shape == (1, 6, 8, 2)
    assert infer_node(_dft(""), {"x": x})[0].shape == (1, 10, 5, 2)  # the default, -2


def test_an_untyped_axis_is_not_taken_for_the_default():
    x = TensorType(F32, (1, 10, 8, 1))
    assert infer_node(_dft("axis"), {"x": x})[0].shape == (1, None, None, 2)


# -- data inference claims before the run ---------------------------------------------------

def test_training_batch_norm_statistics_do_not_keep_the_inputs_data(tmp_path):
    """In training mode the mean and var outputs are the updated running statistics: their
    type is the inputs', their data is not (inference used to pass the inputs' on)."""
    stats = [numpy_helper.from_array(np.full(2, v, np.float32), n)
             for n, v in (("scale", 1), ("bias", 0), ("mean", 0.5), ("var", 2))]
    graph = h.make_graph(
        [h.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                     ["y", "running_mean", "running_var"], training_mode=1)], "g",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 2])],
        [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "running_mean",
                                                            "running_var")], stats)
    path = _save(tmp_path, graph, opset=15)
    types = infer_types(load_graph(str(path)))
    assert types["running_mean"] == TensorType(F32, (2,))  # no value
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    running_mean = Session(str(path)).run(None, {"x": x})[1]
    np.testing.assert_allclose(running_mean, 0.9 * 0.5 + 0.1 * x.mean(axis=0), rtol=1e-6)
    assert not fits(TensorType(F32, (2,), value=np.full(2, 0.5, np.float32)), running_mean)
