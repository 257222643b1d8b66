"""Loop reads its body's cond back only where the body could make it false.

Each look at the cond is a device-to-host read, and on a GPU a wait for the iteration to
finish. Exporters write a ``for`` loop as a Loop whose body hands its cond input back
(through Identity, or as a constant true); such a loop runs to its trip count, so the kernel
skips the reads. Every variant is checked against onnxruntime, and on the fake CuPy the
reads are counted."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError
from mixrt.ops.control.control import _cond_stays_true
from mixrt.ops.device import gpu_available
from mixrt.importers.onnx import import_model

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def _cond_nodes(kind: str) -> tuple[list, str, list]:
    """Body nodes that make its cond output, the output's name, and body initializers."""
    true = numpy_helper.from_array(np.array(True), "always")
    if kind == "identity":
        return [helper.make_node("Identity", ["cond_in"], ["c1"]),
                helper.make_node("Identity", ["c1"], ["cond_out"])], "cond_out", []
    if kind == "passthrough":
        return [], "cond_in", []
    if kind == "constant_true":
        return [helper.make_node("Constant", [], ["cond_out"], value=true)], "cond_out", []
    if kind == "constant_false":
        false = numpy_helper.from_array(np.array(False), "never")
        return [helper.make_node("Constant", [], ["cond_out"], value=false)], "cond_out", []
    if kind == "initializer_true":
        return [helper.make_node("Identity", ["always"], ["cond_out"])], "cond_out", [true]
    if kind == "computed":  # i < 6: the iteration with i = 6 is the last
        six = numpy_helper.from_array(np.array(6, np.int64), "six")
        return [helper.make_node("Less", ["i", "six"], ["cond_out"])], "cond_out", [six]
    if kind == "outer":  # a value of the enclosing graph: not known to stay true
        return [helper.make_node("Identity", ["go_on"], ["cond_out"])], "cond_out", []
    raise ValueError(kind)


def _loop_model(kind: str):
    """x -> Loop(M, true): each iteration adds 1 to the state and scans it out."""
    nodes, cond_out, initializers = _cond_nodes(kind)
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    body = helper.make_graph(
        [*nodes, helper.make_node("Add", ["x_in", "one"], ["x_out"]),
         helper.make_node("Identity", ["x_out"], ["x_scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("x_scan", TensorProto.FLOAT, [3])],
        initializer=[one, *initializers])
    loop = helper.make_node("Loop", ["M", "start", "x"], ["x_final", "xs"], body=body)
    graph = helper.make_graph(
        [loop], "loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("x_final", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("xs", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array(True), "start")] +
        ([numpy_helper.from_array(np.array(True), "go_on")] if kind == "outer" else []))
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


KINDS = ["identity", "passthrough", "constant_true", "constant_false", "initializer_true",
         "computed", "outer"]
STAYS_TRUE = {"identity", "passthrough", "constant_true", "initializer_true"}


@pytest.mark.parametrize("kind", KINDS)
def test_which_bodies_keep_a_true_cond(kind):
    body = import_model(_loop_model(kind)).nodes[0].attributes["body"]
    assert _cond_stays_true(body) == (kind in STAYS_TRUE)


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_every_cond_kind_runs_as_onnxruntime_runs_it(kind, opt_level):
    model = _loop_model(kind)
    feeds = {"M": np.array(9, np.int64), "x": np.arange(3, dtype=np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = mixrt.Session(model, opt_level=opt_level).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len(got[1]) == {"constant_false": 1, "computed": 7}.get(kind, 9)


def _reads_per_run(session, trips: int) -> int:
    import cupy  # noqa: PLC0415
    before = cupy._core.host_reads()
    session.run(None, {"M": np.array(trips, np.int64), "x": np.zeros(3, np.float32)})
    return cupy._core.host_reads() - before


@needs_gpu
@pytest.mark.parametrize("kind", ["identity", "constant_true", "computed"])
def test_a_loop_that_keeps_its_cond_true_reads_nothing_back_per_iteration(kind):
    import cupy  # noqa: PLC0415
    if not getattr(cupy, "IS_FAKE", False):
        pytest.skip("counts device-to-host reads, which only the fake CuPy can")
    session = mixrt.Session(_loop_model(kind), device="gpu")
    short, long = _reads_per_run(session, 3), _reads_per_run(session, 40)
    if kind in STAYS_TRUE:
        assert long == short  # the trip count, the start cond and the outputs, once each
    else:
        assert long > short  # the counter does see the per-iteration reads
    got = session.run(None, {"M": np.array(40, np.int64), "x": np.zeros(3, np.float32)})
    assert len(got[1]) == (7 if kind == "computed" else 40)


def test_a_loop_that_could_never_stop_is_an_error_naming_the_node():
    """No trip count and a body that keeps cond true: onnxruntime would spin forever (and
    a scan output would grow until memory ran out); mixrt says why at once."""
    model = _loop_model("identity")
    loop = model.graph.node[0]
    loop.input[0] = ""  # no M
    loop.name = "forever"
    del model.graph.input[0]
    session = mixrt.Session(model)
    with pytest.raises(ExecutionError, match="'forever'.*never stop"):
        session.run(None, {"x": np.zeros(3, np.float32)})


@pytest.mark.parametrize("kind, start", [("computed", True), ("identity", False)])
def test_without_a_trip_count_a_false_start_or_a_body_cond_still_ends_the_loop(kind, start):
    model = _loop_model(kind)
    model.graph.node[0].input[0] = ""
    del model.graph.input[0]
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(start), "start"))
    feeds = {"x": np.zeros(3, np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = mixrt.Session(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len(got[1]) == (7 if start else 0)
