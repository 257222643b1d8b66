"""Shape inference through If, Loop, Scan and SequenceMap bodies.

A control-flow op's output types come from inferring its bodies: a Loop's or Scan's carried
states are widened until they hold on every iteration, scan outputs get their new axis, and
the bodies' own values are typed. The soundness check runs real models (the ONNX backend
cases with subgraphs, and hand-built ones) and asserts that every value any iteration made,
at the top level and inside bodies, fits the type inference gave it.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import mixrt  # noqa: F401  (registers the ONNX loader)
from mixrt.errors import ExecutionError
from mixrt.ops.ir.types import SequenceType, TensorType
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import Session, load_graph
from soundness import assert_sound, backend_node_cases, case_inputs


# -- the ONNX backend cases that hold subgraphs --------------------------------------------

@functools.cache
def _cases_with_subgraphs() -> dict:
    def holds_graph(graph) -> bool:
        return any(a.type == onnx.AttributeProto.GRAPH for n in graph.node for a in n.attribute)

    return {case.name: case for case in backend_node_cases() if holds_graph(case.model.graph)}


@pytest.mark.parametrize("name", sorted(_cases_with_subgraphs()))
def test_backend_case_values_fit_their_inferred_types(name, tmp_path, monkeypatch):
    case = _cases_with_subgraphs()[name]
    path = tmp_path / "model.onnx"
    onnx.save(case.model, str(path))
    feeds = dict(zip([v.name for v in case.model.graph.input], case_inputs(case)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_sound(path, feeds, monkeypatch)


def test_the_backend_cases_include_every_control_flow_op():
    ops = {node.op_type for case in _cases_with_subgraphs().values()
           for node in case.model.graph.node}
    assert {"If", "Loop", "Scan", "SequenceMap"} <= ops


# -- hand-built models -------------------------------------------------------------------

def _save(tmp_path, nodes, inputs, outputs, opset=17, initializers=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def _loop_body(nodes, carried, scanned, initializers=()):
    """A Loop body declaring nothing but its counters: every other type is inferred."""
    inputs = [h.make_tensor_value_info("i", T.INT64, []),
              h.make_tensor_value_info("c_in", T.BOOL, [])]
    inputs += [h.make_tensor_value_info(f"{name}_in", T.FLOAT, None) for name in carried]
    outputs = [h.make_tensor_value_info("c_out", T.BOOL, [])]
    outputs += [h.make_tensor_value_info(f"{name}_out", T.FLOAT, None) for name in carried]
    outputs += [h.make_tensor_value_info(name, T.FLOAT, None) for name in scanned]
    nodes = [h.make_node("Identity", ["c_in"], ["c_out"]), *nodes]
    return h.make_graph(nodes, "body", inputs, outputs, list(initializers))


def _compare_with_onnxruntime(path, feeds):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = Session(str(path)).run(None, feeds)
    for a, b in zip(want, got):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-6)


def test_a_state_that_grows_each_iteration_ends_with_that_dim_unknown(tmp_path, monkeypatch):
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    body = _loop_body([h.make_node("Concat", ["s_in", "one"], ["s_out"], axis=0),
                       h.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0)],
                      ["s"], ["total"], [one])
    path = _save(tmp_path, [h.make_node("Loop", ["M", "", "s0"], ["s", "totals"], body=body),
                            h.make_node("Relu", ["s"], ["r"])],
                 [h.make_tensor_value_info("M", T.INT64, []),
                  h.make_tensor_value_info("s0", T.FLOAT, [2])],
                 [h.make_tensor_value_info("r", T.FLOAT, None),
                  h.make_tensor_value_info("totals", T.FLOAT, None)])
    for trips in (0, 1, 3):
        feeds = {"M": np.array(trips), "s0": np.zeros(2, np.float32)}
        types = assert_sound(path, feeds, monkeypatch)
        _compare_with_onnxruntime(path, feeds)
    assert types["s"].shape == (None,) and types["s_out"].shape == (None,)
    assert types["totals"].shape == (None,) and types["total"].shape == ()
    assert types["r"].shape == (None,)


def test_a_state_of_fixed_shape_keeps_it_and_the_body_is_typed(tmp_path, monkeypatch):
    body = _loop_body([h.make_node("Add", ["s_in", "w"], ["s_out"]),
                       h.make_node("MatMul", ["s_out", "wt"], ["product"])],
                      ["s"], ["product"])
    path = _save(tmp_path, [h.make_node("Transpose", ["w"], ["wt"]),
                            h.make_node("Loop", ["M", "", "s0"], ["s", "products"], body=body)],
                 [h.make_tensor_value_info("M", T.INT64, []),
                  h.make_tensor_value_info("s0", T.FLOAT, [2, 3]),
                  h.make_tensor_value_info("w", T.FLOAT, [2, 3])],
                 [h.make_tensor_value_info("s", T.FLOAT, None),
                  h.make_tensor_value_info("products", T.FLOAT, None)])
    feeds = {"M": np.array(4), "s0": np.ones((2, 3), np.float32),
             "w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    types = assert_sound(path, feeds, monkeypatch)
    _compare_with_onnxruntime(path, feeds)
    assert types["s"].shape == (2, 3) and types["s_in"].shape == (2, 3)
    assert types["product"].shape == (2, 2) and types["products"].shape == (None, 2, 2)


def test_a_state_whose_rank_changes_ends_with_the_rank_unknown(tmp_path, monkeypatch):
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    body = _loop_body([h.make_node("Unsqueeze", ["s_in", "axes"], ["s_out"])], ["s"], [],
                      [axes])
    path = _save(tmp_path, [h.make_node("Loop", ["M", "", "s0"], ["s"], body=body)],
                 [h.make_tensor_value_info("M", T.INT64, []),
                  h.make_tensor_value_info("s0", T.FLOAT, [3])],
                 [h.make_tensor_value_info("s", T.FLOAT, None)])
    for trips in (0, 2):
        types = assert_sound(path, {"M": np.array(trips), "s0": np.ones(3, np.float32)},
                             monkeypatch)
    assert types["s"].dtype == np.float32 and types["s"].shape is None


def _scan_model(tmp_path, output_axis: int):
    body = h.make_graph(
        [h.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         h.make_node("Mul", ["acc_out", "row"], ["made"])], "body",
        [h.make_tensor_value_info("acc_in", T.FLOAT, None),
         h.make_tensor_value_info("row", T.FLOAT, None)],
        [h.make_tensor_value_info("acc_out", T.FLOAT, None),
         h.make_tensor_value_info("made", T.FLOAT, None)])
    scan = h.make_node("Scan", ["acc0", "x"], ["acc", "stacked"], body=body,
                       num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[output_axis])
    return _save(tmp_path, [scan],
                 [h.make_tensor_value_info("acc0", T.FLOAT, [4]),
                  h.make_tensor_value_info("x", T.FLOAT, [4, "steps"])],
                 [h.make_tensor_value_info("acc", T.FLOAT, None),
                  h.make_tensor_value_info("stacked", T.FLOAT, None)])


@pytest.mark.parametrize("output_axis", [0, 1, -1])
def test_scan_outputs_get_the_scan_length_at_their_axis(tmp_path, monkeypatch, output_axis):
    path = _scan_model(tmp_path, output_axis)
    feeds = {"acc0": np.zeros(4, np.float32),
             "x": np.arange(20, dtype=np.float32).reshape(4, 5)}
    types = assert_sound(path, feeds, monkeypatch)
    _compare_with_onnxruntime(path, feeds)
    assert types["acc"].shape == (4,) and types["row"].shape == (4,)
    assert types["stacked"].shape == ((5, 4) if output_axis == 0 else (4, 5))


@pytest.mark.parametrize("output_axis", [0, 1])
def test_a_scan_of_no_steps_shapes_its_outputs_from_the_body(tmp_path, monkeypatch,
                                                             output_axis):
    path = _scan_model(tmp_path, output_axis)
    feeds = {"acc0": np.zeros(4, np.float32), "x": np.zeros((4, 0), np.float32)}
    types = assert_sound(path, feeds, monkeypatch)
    acc, stacked = Session(str(path)).run(None, feeds)
    assert stacked.shape == ((0, 4) if output_axis == 0 else (4, 0))
    assert types["stacked"].shape == stacked.shape
    np.testing.assert_array_equal(acc, feeds["acc0"])


def test_a_loop_of_no_iterations_shapes_its_scan_outputs_from_the_body(tmp_path, monkeypatch):
    """onnxruntime gives (0,) here and warns that it had no shape; the body says each
    element is (3,), so the empty stack is (0, 3)."""
    body = _loop_body([h.make_node("Mul", ["w", "s_in"], ["s_out"]),
                       h.make_node("Identity", ["s_out"], ["seen"])], ["s"], ["seen"])
    path = _save(tmp_path, [h.make_node("Loop", ["M", "", "s0"], ["s", "seen_all"], body=body)],
                 [h.make_tensor_value_info("M", T.INT64, []),
                  h.make_tensor_value_info("s0", T.FLOAT, [3]),
                  h.make_tensor_value_info("w", T.FLOAT, [3])],
                 [h.make_tensor_value_info("s", T.FLOAT, None),
                  h.make_tensor_value_info("seen_all", T.FLOAT, None)])
    feeds = {"M": np.array(0), "s0": np.ones(3, np.float32), "w": np.ones(3, np.float32)}
    types = assert_sound(path, feeds, monkeypatch)
    _, seen_all = Session(str(path)).run(None, feeds)
    assert seen_all.shape == (0, 3) and seen_all.dtype == np.float32
    assert types["seen_all"].shape == (None, 3)


def _if_model(tmp_path, then_shape, else_shape):
    def branch(name, shape):
        target = numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape")
        return h.make_graph([h.make_node("Reshape", ["x", f"{name}_shape"], [f"{name}_y"])],
                            name, [], [h.make_tensor_value_info(f"{name}_y", T.FLOAT, None)],
                            [target])

    node = h.make_node("If", ["cond"], ["y"], then_branch=branch("then", then_shape),
                       else_branch=branch("else", else_shape))
    return _save(tmp_path, [node, h.make_node("Relu", ["y"], ["z"])],
                 [h.make_tensor_value_info("cond", T.BOOL, []),
                  h.make_tensor_value_info("x", T.FLOAT, [6])],
                 [h.make_tensor_value_info("z", T.FLOAT, None)])


@pytest.mark.parametrize("then_shape, else_shape, merged", [
    ((2, 3), (2, 3), (2, 3)), ((2, 3), (3, 2), (None, None)), ((2, 3), (6,), None)])
def test_if_outputs_merge_what_the_branches_infer(tmp_path, monkeypatch, then_shape,
                                                  else_shape, merged):
    path = _if_model(tmp_path, then_shape, else_shape)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": np.arange(6, dtype=np.float32)}
        types = assert_sound(path, feeds, monkeypatch)
        _compare_with_onnxruntime(path, feeds)
    assert types["y"].dtype == np.float32 and types["y"].shape == merged
    assert types["then_y"].shape == then_shape and types["else_y"].shape == else_shape


def test_sequence_map_elements_are_typed_by_the_body(tmp_path, monkeypatch):
    body = h.make_graph([h.make_node("Add", ["element", "bias"], ["shifted"])], "body",
                        [h.make_tensor_value_info("element", T.FLOAT, None)],
                        [h.make_tensor_value_info("shifted", T.FLOAT, None)])
    path = _save(tmp_path, [h.make_node("SequenceMap", ["xs"], ["ys"], body=body)],
                 [h.make_tensor_sequence_value_info("xs", T.FLOAT, [3]),
                  h.make_tensor_value_info("bias", T.FLOAT, [3])],
                 [h.make_tensor_sequence_value_info("ys", T.FLOAT, None)], opset=18)
    feeds = {"xs": [np.ones(3, np.float32), np.zeros(3, np.float32)],
             "bias": np.ones(3, np.float32)}
    types = assert_sound(path, feeds, monkeypatch)
    assert types["ys"] == SequenceType(TensorType(np.dtype(np.float32), (3,)))


def test_declared_dims_win_and_inference_fills_the_rest(tmp_path):
    path = _scan_model(tmp_path, 0)
    graph = load_graph(str(path))
    graph.value_types["stacked"] = TensorType(np.dtype(np.float32), ("steps", None))
    types = infer_types(graph)
    assert types["stacked"].shape == ("steps", 4)


# -- opset 8 Scan: a batch axis and a length per entry -------------------------------------

def _scan8_model(tmp_path):
    body = h.make_graph(
        [h.make_node("Add", ["acc_in", "v"], ["acc_out"]),
         h.make_node("Identity", ["acc_out"], ["made"])], "body",
        [h.make_tensor_value_info("acc_in", T.FLOAT, None),
         h.make_tensor_value_info("v", T.FLOAT, None)],
        [h.make_tensor_value_info("acc_out", T.FLOAT, None),
         h.make_tensor_value_info("made", T.FLOAT, None)])
    scan = h.make_node("Scan", ["lens", "acc0", "x"], ["acc", "stacked"], body=body,
                       num_scan_inputs=1)
    return _save(tmp_path, [scan],
                 [h.make_tensor_value_info("lens", T.INT64, [2]),
                  h.make_tensor_value_info("acc0", T.FLOAT, [2, 2]),
                  h.make_tensor_value_info("x", T.FLOAT, [2, 3, 2])],
                 [h.make_tensor_value_info("acc", T.FLOAT, None),
                  h.make_tensor_value_info("stacked", T.FLOAT, None)], opset=8)


def test_scan8_against_onnxruntime(tmp_path, monkeypatch):
    path = _scan8_model(tmp_path)
    feeds = {"lens": np.array([1, 3], np.int64), "acc0": np.ones((2, 2), np.float32),
             "x": np.arange(12, dtype=np.float32).reshape(2, 3, 2)}
    types = assert_sound(path, feeds, monkeypatch)
    _compare_with_onnxruntime(path, feeds)
    assert types["acc"].shape == (2, 2) and types["stacked"].shape == (2, 3, 2)


def test_scan8_entry_of_length_zero_keeps_its_state_and_is_padding_only(tmp_path, monkeypatch):
    """onnxruntime refuses a length of 0; the spec does not, and its meaning is plain."""
    path = _scan8_model(tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    feeds = {"lens": np.array([0, 2], np.int64), "acc0": np.ones((2, 2), np.float32), "x": x}
    assert_sound(path, feeds, monkeypatch)
    acc, stacked = Session(str(path)).run(None, feeds)
    np.testing.assert_array_equal(acc, [[1, 1], 1 + x[1, 0] + x[1, 1]])
    np.testing.assert_array_equal(stacked[0], np.zeros((3, 2)))
    np.testing.assert_array_equal(stacked[1], [1 + x[1, 0], 1 + x[1, 0] + x[1, 1], [0, 0]])


def test_scan8_refuses_lengths_outside_the_scan_axis(tmp_path):
    path = _scan8_model(tmp_path)
    feeds = {"lens": np.array([4, 2], np.int64), "acc0": np.ones((2, 2), np.float32),
             "x": np.zeros((2, 3, 2), np.float32)}
    with pytest.raises(ExecutionError, match=r"sequence_lens \[4, 2\].*\[0, 3\]"):
        Session(str(path)).run(None, feeds)


# -- a Loop's trip count, when plan time knows it ------------------------------------------

def _counting_loop(tmp_path, cond: str, cond_out_node, trips=None, cond_value=None):
    """A Loop stacking w * i for i < M; M and cond are constants when given values."""
    body = h.make_graph(
        [cond_out_node,
         h.make_node("Cast", ["i"], ["i_f"], to=T.FLOAT),
         h.make_node("Mul", ["w", "i_f"], ["made"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("c_in", T.BOOL, [])],
        [h.make_tensor_value_info("c_out", T.BOOL, []),
         h.make_tensor_value_info("made", T.FLOAT, None)],
        [numpy_helper.from_array(np.array(2, np.int64), "two")])
    constants = [numpy_helper.from_array(np.array(trips, np.int64), "M")]
    if cond_value is not None:
        constants.append(numpy_helper.from_array(np.array(cond_value), "cond"))
    return _save(tmp_path, [h.make_node("Loop", ["M", cond], ["stack"], body=body),
                            h.make_node("Relu", ["stack"], ["out"])],
                 [h.make_tensor_value_info("w", T.FLOAT, [3])],
                 [h.make_tensor_value_info("out", T.FLOAT, None)], initializers=constants)


_KEEP = h.make_node("Identity", ["c_in"], ["c_out"])
_STOP_AFTER_TWO = h.make_node("Less", ["i", "two"], ["c_out"])


@pytest.mark.parametrize("cond, cond_out, cond_value, trips, length", [
    ("", _KEEP, None, 4, 4),               # no cond input, and the body keeps it true
    ("", _STOP_AFTER_TWO, None, 4, None),  # the body's cond output stops it (as in ort)
    ("cond", _KEEP, True, 4, 4),           # a true cond the body keeps true
    ("cond", _STOP_AFTER_TWO, True, 4, None),  # the body may stop the loop early
    ("cond", _KEEP, False, 4, 0),          # a false cond: no iteration
    ("", _KEEP, None, 0, 0),               # a trip count of 0
    ("", _KEEP, None, -3, 0),              # ... or below
])
def test_a_loop_with_a_constant_trip_count_stacks_a_known_length(
        tmp_path, monkeypatch, cond, cond_out, cond_value, trips, length):
    path = _counting_loop(tmp_path, cond, cond_out, trips, cond_value)
    feeds = {"w": np.array([1, 2, 3], np.float32)}
    types = assert_sound(path, feeds, monkeypatch)
    assert types["out"].shape == (length, 3)
    if length != 0:  # onnxruntime gives (0,) for an empty stack (see above)
        _compare_with_onnxruntime(path, feeds)


def test_a_loop_that_runs_no_iteration_keeps_its_states_initial_types(tmp_path, monkeypatch):
    """A state that would grow keeps its initial shape when no iteration runs, and the
    empty scan output takes its element shape from that initial state."""
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    body = _loop_body([h.make_node("Concat", ["s_in", "one"], ["s_out"], axis=0),
                       h.make_node("Identity", ["s_out"], ["seen"])], ["s"], ["seen"], [one])
    path = _save(tmp_path, [h.make_node("Loop", ["M", "", "s0"], ["s", "seen_all"], body=body)],
                 [h.make_tensor_value_info("s0", T.FLOAT, [2])],
                 [h.make_tensor_value_info("s", T.FLOAT, None),
                  h.make_tensor_value_info("seen_all", T.FLOAT, None)],
                 initializers=[numpy_helper.from_array(np.array(0, np.int64), "M")])
    types = assert_sound(path, {"s0": np.zeros(2, np.float32)}, monkeypatch)
    assert types["s"].shape == (2,) and types["seen_all"].shape == (0, 3)
    _, seen_all = Session(str(path)).run(None, {"s0": np.zeros(2, np.float32)})
    assert seen_all.shape == (0, 3)


# -- sibling bodies that reuse a name ---------------------------------------------------------

def _branch(name: str, x: str, residual: str) -> onnx.GraphProto:
    """``mixed = x @ w`` then ``out = mixed + residual``: the Add may be fused into the
    product only where the residual does not broadcast the product larger."""
    return h.make_graph([h.make_node("MatMul", [x, "w"], ["mixed"]),
                         h.make_node("Add", ["mixed", residual], ["out"])], name, [],
                        [h.make_tensor_value_info("out", T.FLOAT, None)])


@pytest.mark.parametrize("opt_level", [0, 2])
def test_if_branches_reusing_a_name_with_other_shapes_run_at_every_opt_level(opt_level):
    """Both branches name their product ``mixed``: (2, 2, 3) in one, (2, 1, 3) in the other.
    Types merged by name gave the one branch the other's shape, and the in-place residual
    Add fused on that shape failed when it ran."""
    rng = np.random.default_rng(0)
    graph = h.make_graph(
        [h.make_node("If", ["pick"], ["y"], then_branch=_branch("then", "wide", "residual"),
                     else_branch=_branch("else", "narrow", "residual"))], "g",
        [h.make_tensor_value_info("pick", T.BOOL, []),
         h.make_tensor_value_info("narrow", T.FLOAT, [2, 1, 4]),
         h.make_tensor_value_info("wide", T.FLOAT, [2, 2, 4]),
         h.make_tensor_value_info("residual", T.FLOAT, [2, 2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        initializer=[numpy_helper.from_array(
            rng.standard_normal((4, 3)).astype(np.float32), "w")])
    model = h.make_model(graph, ir_version=8,
                         opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    session = Session(model, opt_level=opt_level)
    feeds = {name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in (("narrow", (2, 1, 4)), ("wide", (2, 2, 4)),
                                 ("residual", (2, 2, 3)))}
    for pick in (True, False):
        feeds["pick"] = np.array(pick)
        np.testing.assert_allclose(session.run(None, feeds)[0],
                                   reference.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
