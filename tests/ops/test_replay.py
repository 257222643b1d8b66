"""Replayed convolution and dense-product calls (ops/compiled/replay.py): a node's planned runs
after the first go straight to the native call, and give what the full path gives, for every
form that records (direct, grouped 1x1, depthwise convolutions; MatMul, Gemm and FusedMatMul
against a constant weight through the panels) and through whatever changes between calls
(the input's values, the thread, the thread's scratch buffers, an activation applied after
the kernel)."""

import gc
import threading
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixrt.ops.attention.fused_rotary import fused_rotary, fused_rotary_cpu
from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.conv.conv_cpu import conv_cpu, direct
from mixrt.runtime import run_loop
from mixrt.runtime.blas_threads import GATE
from mixrt.runtime.session import Session

pytestmark = pytest.mark.skipif(jit_cpu.native_pool() is None or jit_cpu.panel_kernels()
                                is None, reason="replays record native calls (AVX-512, "
                                "the native pool, two threads)")
RNG = np.random.default_rng(5)
F = TensorProto.FLOAT


def _model(conv_nodes, weights, channels=16, size=40):
    """x -> Relu -> the conv nodes -> Neg -> y (so each conv reads and writes arena
    views: a graph's inputs and outputs are not in its arena); ``size`` None: any image
    size."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + conv_nodes + [
        helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", F, (1, channels, size or "h", size or "w"))], [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(w, name) for name, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _weights(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def _spy_on_replays(monkeypatch) -> list:
    """From now on, (id of the node's dict, whether it replayed) for every replay check.
    Planned runs call their kernels each time (no bound calls): a bound call is the
    recorded action without the kernel's replay check (tests/test_bound_calls.py)."""
    monkeypatch.setattr(run_loop, "BIND", False)
    fired: list = []
    original = replay.replayed
    monkeypatch.setattr(replay, "replayed", lambda state, arrays: fired.append(
        (id(state), original(state, arrays))) or fired[-1][1])
    return fired


def _replays_of(fired, state) -> list:
    return [done for owner, done in fired if owner == id(state)]


def _runs_match_the_unoptimized_graph(model, shape, tolerance, nan=False, runs=4):
    """``runs`` runs of new values at opt_level 2 against opt_level 0; the optimized
    session."""
    session, plain = Session(model, opt_level=2), Session(model, opt_level=0)
    for _ in range(runs):
        x = RNG.standard_normal(shape).astype(np.float32)
        if nan:
            x.reshape(-1)[1234] = np.nan  # a max pool passes NaN on, replayed or not
        np.testing.assert_allclose(session.run(None, {"x": x})[0],
                                   plain.run(None, {"x": x})[0], rtol=tolerance,
                                   atol=tolerance)
    return session


CASES = {
    # a direct 3x3 conv, then a grouped 1x1 conv (4 groups), then a depthwise 3x3 one
    "direct": ([helper.make_node("Conv", ["r", "w", "b"], ["c"], pads=[1] * 4)],
               {"w": _weights(32, 16, 3, 3), "b": _weights(32)}),
    "grouped": ([helper.make_node("Conv", ["r", "w", "b"], ["g"], group=4),
                 helper.make_node("Relu", ["g"], ["c"])],
                {"w": _weights(32, 4, 1, 1), "b": _weights(32)}),
    "depthwise": ([helper.make_node("Conv", ["r", "w"], ["c"], group=16, pads=[1] * 4)],
                  {"w": _weights(16, 1, 3, 3)}),
    "sigmoid after": ([helper.make_node("Conv", ["r", "w", "b"], ["g"], pads=[1] * 4),
                       helper.make_node("Sigmoid", ["g"], ["c"])],
                      {"w": _weights(32, 16, 3, 3), "b": _weights(32)}),
}


def _conv_nodes(session):
    return [s for s in session._bound.nodes if s.node.op_type in ("Conv", "FusedConv")]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_later_runs_replay_and_match_the_unoptimized_graph(case, monkeypatch):
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(_model(*CASES[case]), (1, 16, 40, 40), 1e-4)
    (step,) = _conv_nodes(session)
    prepacked = step.attributes["_prepacked"]
    ours = _replays_of(fired, prepacked)
    # (the tile applies no Sigmoid: the replay makes the compiled Sigmoid pass after it)
    assert replay.KEY in prepacked
    assert ours[-2:] == [True, True]  # the planned runs after the first replayed


def _any_size_conv(monkeypatch):
    """(the replay spy, a session of the direct conv at any image size, its node's dict), in
    a process none of whose arenas came back yet."""
    fired = _spy_on_replays(monkeypatch)
    monkeypatch.setattr(replay, "_returns", [0.0])
    session = Session(_model(*CASES["direct"], size=None), opt_level=2)
    (step,) = _conv_nodes(session)
    return fired, session, step.attributes["_prepacked"]


def test_an_arenas_first_run_records_nothing_and_its_second_does(monkeypatch):
    """Where few arenas come back, a shape sent once never replays: its run neither records
    nor keeps the replay of the size before; the same size run again records, and its
    third run replays."""
    fired, session, prepacked = _any_size_conv(monkeypatch)
    recorded = []
    for size in (40, 36):
        x = RNG.standard_normal((1, 16, size, size)).astype(np.float32)
        session.run(None, {"x": x})
        assert replay.KEY not in prepacked  # the earlier size's replay was let go too
        session.run(None, {"x": x})
        recorded.append(prepacked[replay.KEY])
        session.run(None, {"x": x})
        assert prepacked[replay.KEY] is recorded[-1]
        assert _replays_of(fired, prepacked)[-1] is True
    assert recorded[0] is not recorded[1]


def test_where_arenas_come_back_a_first_run_records(monkeypatch):
    """Sizes that come back (each run twice) raise the share of returning arenas until a
    first run records, so that the second replays; new sizes only bring it down again."""
    fired, session, prepacked = _any_size_conv(monkeypatch)
    first_recorded = []
    for size in range(20, 60, 2):
        x = RNG.standard_normal((1, 16, size, size)).astype(np.float32)
        session.run(None, {"x": x})
        first_recorded.append(replay.KEY in prepacked)
        session.run(None, {"x": x})
    assert not first_recorded[0] and first_recorded[-1]
    assert _replays_of(fired, prepacked)[-1] is True  # the last second run replayed
    assert replay._returns[0] >= replay.RECORD_FROM_SHARE
    for size in range(61, 101, 2):  # new sizes, once each
        session.run(None, {"x": RNG.standard_normal((1, 16, size, size)).astype(np.float32)})
    assert replay._returns[0] < replay.RECORD_FROM_SHARE
    assert replay.KEY not in prepacked


def test_a_size_run_again_counts_as_come_back_and_binds_only_at_its_bind_run(monkeypatch):
    """On the compiled tier, a size's second run (same thread, tier and pool as its first)
    tells the estimate that its arena came back, so that sizes sent twice each soon make
    first runs record; and its calls are bound in its BIND_AT_RUN-th run, not before (a
    shape a service sends twice pays no binding). (With bound calls on, as a service runs:
    the tests above spy on replays without them.)"""
    monkeypatch.setattr(replay, "_returns", [0.0])
    session = Session(_model(*CASES["direct"], size=None), opt_level=2)
    session.run(None, {"x": RNG.standard_normal((1, 16, 18, 18)).astype(np.float32)})
    session.wait_compiled()
    returns = []
    for size in range(20, 52, 2):
        x = RNG.standard_normal((1, 16, size, size)).astype(np.float32)
        session.run(None, {"x": x})
        session.run(None, {"x": x})
        returns.append(replay._returns[0])
        plan = list(session._steady_runs.values())[-1].plan  # the lane of this size
        assert not any(arena.bound for arena in plan.pool)  # twice: nothing bound
    assert returns[-1] >= replay.RECORD_FROM_SHARE and returns == sorted(returns)
    for _ in range(2 * run_loop.BIND_AT_RUN):  # a run's thread is the gate's: keys may alternate
        if any(arena.bound for arena in plan.pool):
            break
        session.run(None, {"x": x})
    arena = next(arena for arena in plan.pool if arena.bound)
    (key,) = arena.bound
    assert arena.ran[key] == run_loop.BIND_AT_RUN - 1  # bound in its BIND_AT_RUN-th run


def test_a_replay_lapses_when_the_scratch_of_its_thread_grows():
    model = _model(*CASES["direct"])
    session, plain = Session(model, opt_level=2), Session(model, opt_level=0)
    x = RNG.standard_normal((1, 16, 40, 40)).astype(np.float32)
    want = plain.run(None, {"x": x})[0]
    # runs happen on the thread the BLAS gate picks (this one, or its runner once another
    # thread has run): the scratch is reset and grown there
    GATE.run(_fresh_scratch)
    for _ in range(3):
        session.run(None, {"x": x})
    (step,) = _conv_nodes(session)
    prepacked = step.attributes["_prepacked"]
    recorded = prepacked[replay.KEY]
    assert recorded.thread == GATE.run(threading.get_ident)
    # a larger convolution on that thread reallocates its planes: the replay lapses and the
    # next run takes the full path, which records anew
    assert GATE.run(_grow_the_planes) != recorded.scratch
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
    assert prepacked[replay.KEY] is not recorded


def _fresh_scratch():
    jit_cpu._scratch.__dict__.clear()
    jit_cpu._thread_kits().clear()


def _grow_the_planes() -> int:
    grown = direct(np.ones((1, 16, 120, 120), np.float32), _weights(32, 16, 3, 3), None, None,
                   conv_direct_cpu.NO_ACTIVATION, dict(auto_pad="NOTSET", dilations=None,
                                                       group=1, kernel_shape=None,
                                                       pads=[1] * 4, strides=None), None, {})
    assert grown is not None
    return jit_cpu.scratch_generation()


def _grouped_call():
    """A grouped 1x1 conv called into its own out, recorded: (X, W, B, out, its dict)."""
    X, W, B = RNG.standard_normal((1, 16, 20, 20)).astype(np.float32), _weights(32, 4, 1, 1), \
        _weights(32)
    out, prepacked = np.empty((1, 32, 20, 20), np.float32), {}
    conv_cpu(np, X, W, B, group=4, out=out, _prepacked=prepacked)
    assert replay.replayed(prepacked, (X, W, B, None, out))
    return X, W, B, out, prepacked


def test_a_replay_is_not_taken_on_another_thread():
    X, W, B, out, prepacked = _grouped_call()
    elsewhere = []

    def call_there():
        # even where the scratch count happens to match, the kit is another thread's
        jit_cpu._kits.generation = prepacked[replay.KEY].scratch
        elsewhere.append(replay.replayed(prepacked, (X, W, B, None, out)))
    other = threading.Thread(target=call_there)
    other.start()
    other.join()
    assert elsewhere == [False]


def test_a_replay_holds_its_arrays_weakly():
    X, W, B, out, prepacked = _grouped_call()
    elsewhere = np.empty((1, 32, 20, 20), np.float32)  # made while out lives: apart from it
    gone = weakref.ref(out)
    del out
    gc.collect()
    assert gone() is None  # the replay kept nothing of the output alive
    assert not replay.replayed(prepacked, (X, W, B, None, elsewhere))


POOLS = {
    # over its dying input (the planner's shrinking in-place pair), then apart from it
    "max in place": helper.make_node("MaxPool", ["r"], ["c"], kernel_shape=[3, 3],
                                     strides=[2, 2]),
    "average, same size": helper.make_node("AveragePool", ["r"], ["c"], kernel_shape=[3, 3],
                                           pads=[1] * 4),
    "average, strided": helper.make_node("AveragePool", ["r"], ["c"], kernel_shape=[3, 3],
                                         strides=[2, 2], pads=[1] * 4),
}


@pytest.mark.parametrize("case", list(POOLS), ids=list(POOLS))
def test_pools_replay_and_match_the_unoptimized_graph(case, monkeypatch):
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(_model([POOLS[case]], {}), (1, 16, 40, 40),
                                                1e-5, nan=True)
    (step,) = [s for s in session._bound.nodes if s.node.op_type.endswith("Pool")]
    node = step.attributes["_node"]
    assert replay.KEY in node and _replays_of(fired, node)[-2:] == [True, True]
    if case == "max in place":
        arrays = node[replay.KEY].refs
        assert np.may_share_memory(arrays[0](), arrays[1]())  # it did run in place


SMALL_POOLS = {
    # SqueezeNet's last MaxPool (3x3 stride 2, ceil mode) on 7x7 planes: 3x3 outputs, one
    # call on this thread, over its dying input
    "max in place, ceil mode": helper.make_node("MaxPool", ["r"], ["c"], kernel_shape=[3, 3],
                                                strides=[2, 2], ceil_mode=1),
    "average, same size": POOLS["average, same size"],
    # a same-size pool with one-row windows: no edge rows in its chunked loop
    "max, one-row window": helper.make_node("MaxPool", ["r"], ["c"], kernel_shape=[1, 3],
                                            pads=[0, 1, 0, 1]),
}


@pytest.mark.parametrize("case", list(SMALL_POOLS), ids=list(SMALL_POOLS))
def test_small_pools_replay_their_one_call_on_this_thread(case, monkeypatch):
    # too small to hand to the native workers: the call on this thread is the replay
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(
        _model([SMALL_POOLS[case]], {}, channels=32, size=7), (1, 32, 7, 7), 1e-5, nan=True)
    (step,) = [s for s in session._bound.nodes if s.node.op_type.endswith("Pool")]
    node = step.attributes["_node"]
    assert replay.KEY in node and _replays_of(fired, node)[-2:] == [True, True]


def test_an_input_made_anew_each_run_over_the_same_bytes_replays(monkeypatch):
    # Relu -> Reshape (a view of the Relu's arena slot, a new array object every run) ->
    # depthwise conv: matched by address, shape, strides and dtype instead of identity
    shape = helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
        np.array([1, 16, 40, 40], np.int64)))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), shape,
             helper.make_node("Reshape", ["r", "shape"], ["v"]),
             helper.make_node("Conv", ["v", "w"], ["c"], group=16, pads=[1] * 4),
             helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, (1, 16, 1600))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(_weights(16, 1, 3, 3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fired = _spy_on_replays(monkeypatch)
    # (the first run records nothing, the second by identity, the third finds the view
    # made anew and records its layout)
    session = _runs_match_the_unoptimized_graph(model, (1, 16, 1600), 1e-5, runs=5)
    (step,) = _conv_nodes(session)
    state = step.attributes["_prepacked"]
    assert _replays_of(fired, state)[-2:] == [True, True]
    assert state[replay.KEY].refs[0]() is None  # the recorded view itself is gone
    layouts = state[replay.KEY].layouts
    assert layouts is not None  # kept by its layout (replay.DRIFTS)
    # only the view made anew is read for its address: the weight and the output are
    # matched by identity
    assert state[replay.DRIFTS] == {0}
    assert layouts[0] is not None and all(layout is None for layout in layouts[1:])


def test_a_new_shapes_records_read_no_addresses(monkeypatch):
    """Nodes whose arrays come back as the same objects are matched by identity alone: a
    new shape per run records every call without reading an address (~2.5 us an array),
    and the shape that comes back still replays."""
    fired = _spy_on_replays(monkeypatch)
    session = Session(_model(*CASES["direct"], size="side"))
    read = []
    real = replay._layout
    monkeypatch.setattr(replay, "_layout", lambda a: read.append(a.shape) or real(a))
    for size in (20, 24, 28, 20, 20):
        session.run(None, {"x": RNG.standard_normal((1, 16, size, size)).astype(np.float32)})
    (step,) = _conv_nodes(session)
    state = step.attributes["_prepacked"]
    assert read == [] and state[replay.KEY].layouts is None
    assert _replays_of(fired, state)[-1] is True


def test_a_fused_elementwise_chain_replays(monkeypatch):
    # (a per-channel scale, a shift, Relu) between two transposes: one FusedElementwise that
    # reads and writes arena views
    scale = numpy_helper.from_array(_weights(1, 16, 1, 1) + 1, "scale")
    shift = numpy_helper.from_array(_weights(1, 16, 1, 1), "shift")
    nodes = [helper.make_node("Transpose", ["x"], ["r"], perm=[0, 1, 3, 2]),
             helper.make_node("Mul", ["r", "scale"], ["m"]),
             helper.make_node("Add", ["m", "shift"], ["a"]),
             helper.make_node("Relu", ["a"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", F, (1, 16, 40, 40))], [helper.make_tensor_value_info("y", F, None)],
        [scale, shift])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(model, (1, 16, 40, 40), 1e-6)
    (step,) = [s for s in session._bound.nodes if s.node.op_type == "FusedElementwise"]
    state = step.attributes["_node"]
    assert _replays_of(fired, state)[-2:] == [True, True]


PRODUCTS = {
    # (nodes after x -> Relu -> r, weights): a 64 x 256 activation through a dense layer
    "MatMul": ([helper.make_node("MatMul", ["r", "w"], ["c"])], {"w": _weights(256, 256)}),
    "MatMul and bias": ([helper.make_node("MatMul", ["r", "w"], ["m"]),
                         helper.make_node("Add", ["m", "b"], ["c"])],
                        {"w": _weights(256, 512), "b": _weights(512)}),
    "Gemm": ([helper.make_node("Gemm", ["r", "w", "b"], ["c"], transB=1)],
             {"w": _weights(384, 256), "b": _weights(384)}),
}


@pytest.mark.parametrize("case", PRODUCTS)
def test_products_against_a_constant_weight_replay(case, monkeypatch):
    nodes, weights = PRODUCTS[case]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])] + nodes + [helper.make_node("Neg", ["c"],
                                                                             ["y"])],
        "g", [helper.make_tensor_value_info("x", F, (64, 256))],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(model, (64, 256), 1e-4)
    (step,) = [s for s in session._bound.nodes
               if s.node.op_type in ("MatMul", "FusedMatMul", "Gemm")]
    state = step.attributes["_prepacked"]
    assert replay.KEY in state and _replays_of(fired, state)[-2:] == [True, True]


def test_a_product_with_a_computed_bias_does_not_replay(monkeypatch):
    """A replay holds the bias it was made with: a bias the graph computes is not kept."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("Gemm", ["r", "w", "nb"], ["c"]),
             helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, (64, 256)),
                                           helper.make_tensor_value_info("b", F, (256,))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(_weights(256, 256), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session, plain = Session(model, opt_level=2), Session(model, opt_level=0)
    for _ in range(3):
        feeds = {"x": RNG.standard_normal((64, 256)).astype(np.float32),
                 "b": RNG.standard_normal(256).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], plain.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-4)
    (step,) = [s for s in session._bound.nodes if s.node.op_type == "Gemm"]
    assert replay.KEY not in step.attributes["_prepacked"]


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization_replays(with_bias, monkeypatch):
    weights = {"s": _weights(256) + 1} | ({"b": _weights(256)} if with_bias else {})
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", *weights], ["c"], epsilon=1e-5),
             helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, (64, 256))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(model, (64, 256), 1e-5)
    (step,) = [s for s in session._bound.nodes if s.node.op_type == "LayerNormalization"]
    state = step.attributes["_node"]
    assert replay.KEY in state and _replays_of(fired, state)[-2:] == [True, True]


def test_rms_normalization_replays(monkeypatch):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SimplifiedLayerNormalization", ["r", "s"], ["c"], epsilon=1e-6),
             helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, (1, 256))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(_weights(256) + 1, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fired = _spy_on_replays(monkeypatch)
    session = _runs_match_the_unoptimized_graph(model, (1, 256), 1e-5)
    (step,) = [s for s in session._bound.nodes
               if s.node.op_type == "SimplifiedLayerNormalization"]
    state = step.attributes["_node"]
    assert replay.KEY in state and _replays_of(fired, state)[-2:] == [True, True]


def test_fused_rotary_replays_on_new_values(monkeypatch):
    fired = _spy_on_replays(monkeypatch)
    X, cos, sin = (np.empty((1, 4, 1, 64), np.float32) for _ in range(3))
    out, state = np.empty_like(X), {}
    for _ in range(3):
        for array in (X, cos, sin):
            array[...] = RNG.standard_normal(array.shape)
        assert fused_rotary_cpu(np, X, cos, sin, out=out, _node=state) is out
        np.testing.assert_allclose(out, fused_rotary(np, X, cos, sin), rtol=1e-6, atol=1e-6)
    assert _replays_of(fired, state) == [False, True, True]
