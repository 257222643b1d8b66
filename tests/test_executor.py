"""The arena executor: planned runs match plain ones, reuse one arena, never hand the caller
arena memory, serve many threads, and cache plans per input-shape signature."""

import gc
import json
import threading
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import InputError
from mixrt.runtime import session as session_module
from mixrt.runtime.feeds import feed_signature


def conv_net(batch="N", expose_view=False):
    """Conv -> Relu -> Conv -> Add(skip) -> Relu -> Flatten -> Gemm -> Softmax, dynamic batch."""
    rng = np.random.default_rng(7)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1,
        "fc": rng.standard_normal((8 * 6 * 6, 5)).astype(np.float32) * 0.05,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="skip"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5]),
         helper.make_tensor_value_info("r1", TensorProto.FLOAT, [batch, 8, 6, 6])]
        + ([helper.make_tensor_value_info("f", TensorProto.FLOAT, [batch, 288])]
           if expose_view else []),
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def batch(n, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((n, 3, 6, 6)).astype(np.float32)}


@pytest.mark.parametrize("strategy", ["naive", "inplace", "sharing", "greedy"])
@pytest.mark.parametrize("opt_level", [0, 2])
def test_planned_runs_match_the_unplanned_reference(strategy, opt_level):
    reference = mixrt.Session(conv_net(), opt_level=0)
    session = mixrt.Session(conv_net(), opt_level=opt_level, strategy=strategy)
    for seed in range(3):  # the first run discovers, the others use the arena
        expected = reference.run(None, batch(2, seed))
        got = session.run(None, batch(2, seed))
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_outputs_never_alias_the_arena():
    # "f" is a Flatten (a view) of an arena tensor: it must be copied out
    session = mixrt.Session(conv_net(expose_view=True), opt_level=0)
    session.run(None, batch(2, 0))
    first = session.run(None, batch(2, 1))
    kept = [a.copy() for a in first]
    session.run(None, batch(2, 2))  # reuses the arena the first results came from
    for before, after in zip(kept, first):
        np.testing.assert_array_equal(before, after)


def test_one_arena_and_no_growth_over_50_runs():
    session = mixrt.Session(conv_net())
    feeds = batch(4)
    session.run(None, feeds)
    session.run(None, feeds)
    plan = session._cached_plan(mixrt.runtime.session.feed_signature(
        session._checked_feeds(feeds)))
    assert len(plan.pool) == 1
    arena = plan.pool[0]
    tracemalloc.start()
    try:
        session.run(None, feeds)
        # garbage in reference cycles (the CPU convolution's strided window views) waits
        # for the cyclic collector, whose timing depends on what ran before: collect on
        # both sides so that only memory the runs keep counts
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            session.run(None, feeds)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert plan.pool == [arena]  # the same arena, no second one
    assert growth < 64 * 1024, f"memory grew by {growth} bytes over 50 runs"


def test_inplace_and_views_are_planned():
    session = mixrt.Session(conv_net(), opt_level=0, strategy="greedy")
    plan = session.memory_plan(batch(2))
    assert ("s", "r2") in plan.inplace  # Relu writes over the Add it consumes
    names = {life.name for life in plan.lifetimes}
    assert "f" not in names  # Flatten is a view of relu2's output, not a tensor of its own
    # small graph outputs get slots living to the run's end, copied as the run returns them
    lives = {life.name: life for life in plan.lifetimes}
    assert lives["y"].last == lives["r1"].last == max(life.last for life in plan.lifetimes)
    assert plan.arena_bytes <= plan.naive_bytes


def test_graph_outputs_in_the_arena_belong_to_the_caller(monkeypatch):
    """An output given a slot (small: ARENA_OUTPUT_BYTES) is copied as the run returns it:
    later runs leave it alone, and it views no arena. A larger one has no slot."""
    from mixrt.runtime import executor
    session = mixrt.Session(conv_net(), strategy="greedy")
    first = session.run(None, batch(2, seed=1))
    kept = [value.copy() for value in first]
    for seed in (2, 3):  # planned runs into the same arena
        again = session.run(None, batch(2, seed))
        assert not np.allclose(again[0], kept[0])
    for value, copy in zip(first, kept):
        np.testing.assert_array_equal(value, copy)
        assert value.flags.owndata  # a copy, not a view of the arena
    monkeypatch.setattr(executor, "ARENA_OUTPUT_BYTES", 0)
    plan = mixrt.Session(conv_net(), strategy="greedy").memory_plan(batch(2))
    names = {life.name for life in plan.lifetimes}
    assert "y" not in names and "r1" not in names  # made by their kernels, not planned


def test_a_gradient_sum_to_its_own_shape_is_a_view():
    """Autodiff cannot prove a symbolic batch's shapes equal, so Add's gradients go through
    SumToShapeOf; where the run shows the shapes are equal, it is a view, not a slot (a
    copy), and where they are not (the broadcast bias), a reduction into a slot of its own."""
    from mixrt.runtime.graph import Graph, Node, Value
    from mixrt.runtime.passes.autodiff import gradient_graph
    from mixrt.ops.ir.types import TensorType
    graph = Graph(name="adds", opsets={"": 17, "mixrt": 1}, inputs=[
        Value("a", TensorType(np.float32, ("N", 4))), Value("b", TensorType(np.float32, ("N", 4))),
        Value("bias", TensorType(np.float32, (4,)))])
    graph.nodes = [Node("Add", ["a", "b"], ["s"], name="add", opset=17),
                   Node("Add", ["s", "bias"], ["t"], name="bias_add", opset=17),
                   Node("Mul", ["t", "t"], ["sq"], name="square", opset=17),
                   Node("ReduceSum", ["sq"], ["loss"], name="loss", opset=17,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["a", "b", "bias"])
    reductions = [n for n in joint.graph.nodes if n.op_type == "SumToShapeOf"]
    assert len(reductions) >= 2  # the symbolic batch hid the equal shapes from autodiff
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal((3, 4)).astype(np.float32),
             "bias": rng.standard_normal(4).astype(np.float32)}
    session = mixrt.Session(joint.graph, opt_level=0)
    wanted = [joint.grads[k] for k in ("a", "b", "bias")]
    grads = session.run(wanted, feeds)
    (plan,) = session._plans.values()
    for node in reductions:
        like = node.inputs[1]
        assert (node.outputs[0] in plan.slots) == (like == "bias"), node.outputs[0]
    t = feeds["a"] + feeds["b"] + feeds["bias"]
    for got, want in zip(grads, (2 * t, 2 * t, (2 * t).sum(axis=0))):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(session.run(wanted, feeds)[0], 2 * t, rtol=1e-6)


def test_plans_are_cached_per_shape_signature_and_bounded(monkeypatch):
    monkeypatch.setattr(session_module, "MAX_CACHED_PLANS", 16)
    session = mixrt.Session(conv_net())
    reference = mixrt.Session(conv_net(), opt_level=0)
    for n in (1, 3, 1, 3):
        np.testing.assert_allclose(session.run(["y"], batch(n, n))[0],
                                   reference.run(["y"], batch(n, n))[0], rtol=1e-5)
    assert len(session._plans) == 2
    for n in range(1, 16 + 4):
        session.run(["y"], batch(n))
    assert len(session._plans) == 16


def test_kept_plans_are_bounded_by_the_memory_of_their_own(monkeypatch):
    """A CPU session's arenas lie on its one buffer and hold nothing of their own: its
    plans are kept by the hundred whatever their arenas' sizes. Arenas with buffers of their
    own (here every one, the session made without the shared buffer, as a GPU session is)
    are kept by the bytes they hold."""
    monkeypatch.setattr(session_module, "MAX_PLAN_BYTES", 1 << 20)
    shared = mixrt.Session(conv_net())
    for n in range(1, 40):
        shared.run(["y"], batch(n))
    assert len(shared._plans) == 39
    assert sum(plan.arena_bytes for plan in shared._plans.values()) > 1 << 20

    monkeypatch.setattr(session_module, "ArenaMemory", lambda: None)
    session = mixrt.Session(conv_net())
    for n in range(1, 40):
        session.run(["y"], batch(n))
    plans = session._plans.values()
    assert all(arena.shared is None for plan in plans for arena in plan.pool)
    assert session_module.MIN_KEPT_PLANS <= len(plans) < 39
    # within the budget, or down to the few kept whatever they hold
    assert sum(plan.arena_bytes for plan in plans) <= 1 << 20 or \
        len(plans) == session_module.MIN_KEPT_PLANS
    assert plans[-1].signature == feed_signature(batch(39))


def test_plans_not_run_lately_let_go_of_buffers_other_than_the_sessions(monkeypatch):
    """Kept plans hold no memory but the session's buffer: once a plan is no longer among
    the most recently run, its idle arenas on a buffer the session has outgrown, and those
    with buffers of their own (a run on another thread made them), go with its calls; run
    again, it gives the same bits."""
    monkeypatch.setattr(session_module, "KEEP_CALLS", 3)
    monkeypatch.setattr(session_module, "KEEP_BUFFERS", 3)
    monkeypatch.setattr(session_module, "TRIM_EVERY", 2)
    session, reference = mixrt.Session(conv_net()), mixrt.Session(conv_net())
    memory = session._arena_memory
    for n in range(1, 16):  # each batch larger: the buffer outgrown again and again
        if n == 4:  # the buffer held, as by another thread's run: an arena of its own
            assert memory.current.take()
            session.run(None, batch(n, seed=n))
            memory.current.give_back()
        else:
            session.run(None, batch(n, seed=n))
    buffers = {id(arena.shared) for plan in session._plans.values() for arena in plan.pool}
    assert len(buffers) <= 1 + 3 + 2  # the current one, the recent plans', the untrimmed
    plan_of = {n: session._cached_plan(feed_signature(session._checked_feeds(batch(n))))
               for n in range(1, 16)}
    assert all(arena.shared is memory.current for n in range(1, 10)
               for arena in plan_of[n].pool)
    assert not plan_of[4].pool  # its own buffer let go
    for n in (1, 4, 9):
        for mine, theirs in zip(session.run(None, batch(n, seed=n)),
                                reference.run(None, batch(n, seed=n))):
            np.testing.assert_array_equal(mine, theirs)


def test_a_sessions_plans_lie_on_one_warm_buffer():
    """Every CPU plan of a session has its arena on the session's one buffer, made larger
    when a plan needs more: a new shape's arena is memory that earlier runs touched, held
    once. A run that finds the buffer taken (another thread's run) gets an arena of its
    own, and so does a run whose outputs are lent out as arena memory."""
    session, reference = mixrt.Session(conv_net()), mixrt.Session(conv_net())

    def arena_of(n: int, lent: bool = False, own: bool = False):
        """The arena a run of batch ``n`` took (``own``: the plan's arena of its own)."""
        feeds = batch(n, seed=n)
        got = session.run_on_device(None, feeds, lent=True) if lent \
            else session.run(None, feeds)
        for mine, theirs in zip(got, reference.run(None, feeds)):
            np.testing.assert_array_equal(mine, theirs)
        pool = session._cached_plan(feed_signature(session._checked_feeds(feeds))).pool
        return next(arena for arena in pool if arena.shared is None) if own else pool[-1]

    largest = arena_of(4)
    smaller = [arena_of(n) for n in (1, 2, 3)]
    assert largest.shared is not None
    assert all(arena.shared is largest.shared for arena in smaller)
    assert all(np.shares_memory(arena.buffer, largest.buffer) for arena in smaller)
    assert largest.shared.take()  # taken, as by a run on another thread
    try:
        assert not largest.shared.take()  # one run at a time
        taken = arena_of(2, own=True)
    finally:
        largest.shared.give_back()
    lent = arena_of(3, lent=True, own=True)
    for arena in (taken, lent):
        assert not np.shares_memory(arena.buffer, largest.buffer)
    assert arena_of(2).shared is largest.shared  # free again: back on the shared buffer


def test_plans_not_run_lately_let_their_prepared_calls_go(monkeypatch):
    """A session keeps hundreds of plans; the prepared and bound calls of all but the most
    recently run are let go (they were most of what a plan held for the cycle collector),
    and a plan run again prepares them again, with the same results."""
    monkeypatch.setattr(session_module, "KEEP_CALLS", 3)
    monkeypatch.setattr(session_module, "KEEP_BUFFERS", 3)
    monkeypatch.setattr(session_module, "TRIM_EVERY", 2)
    session, reference = mixrt.Session(conv_net()), mixrt.Session(conv_net())
    hot = batch(2, seed=99)
    session.run(None, batch(12))  # the buffer at its largest first: the arenas stay on it
    for n in range(1, 12):
        for _ in range(3):  # a lane of its own, its calls bound
            session.run(None, hot)
        session.run(None, batch(n, seed=n))

    def arena(n):
        feeds = batch(n, seed=n)
        return session._cached_plan(feed_signature(session._checked_feeds(feeds))).pool[-1]

    assert arena(2).calls is not None and arena(2).bound  # run all along: kept
    assert arena(11).calls is not None  # the newest
    trimmed = [n for n in range(3, 10) if arena(n).calls is None]
    assert len(trimmed) >= 5 and all(not arena(n).bound for n in trimmed)
    for n in trimmed:
        for mine, theirs in zip(session.run(None, batch(n, seed=n)),
                                reference.run(None, batch(n, seed=n))):
            np.testing.assert_array_equal(mine, theirs)
        assert arena(n).calls is not None


def test_plans_keep_their_calls_longer_than_buffers_of_their_own(monkeypatch):
    """The calls of more plans are kept (KEEP_CALLS) than the arenas on buffers other than
    the session's (KEEP_BUFFERS): a shape met again a while later takes its bound calls,
    and still holds no memory but the session's buffer."""
    monkeypatch.setattr(session_module, "KEEP_CALLS", 8)
    monkeypatch.setattr(session_module, "KEEP_BUFFERS", 2)
    monkeypatch.setattr(session_module, "TRIM_EVERY", 2)
    session, reference = mixrt.Session(conv_net()), mixrt.Session(conv_net())
    memory = session._arena_memory
    session.run(None, batch(13))  # the buffer at its largest first: the arenas stay on it
    for n in range(1, 13):
        for _ in range(3):  # bound from its second run
            session.run(None, batch(n, seed=n))
        if n == 6:  # the buffer held, as by another thread's run: an arena of its own too
            assert memory.current.take()
            session.run(None, batch(n, seed=n))
            memory.current.give_back()

    def pool(n):
        feeds = batch(n, seed=n)
        return session._cached_plan(feed_signature(session._checked_feeds(feeds))).pool

    assert all(arena.shared is memory.current for arena in pool(6))  # its own buffer gone
    assert pool(6) and all(arena.bound for arena in pool(6))  # ... its calls kept
    assert all(not arena.bound for n in (1, 2) for arena in pool(n))  # past KEEP_CALLS
    for n in (1, 6, 12):
        for mine, theirs in zip(session.run(None, batch(n, seed=n)),
                                reference.run(None, batch(n, seed=n))):
            np.testing.assert_array_equal(mine, theirs)


def test_many_threads_get_what_serial_calls_get():
    session = mixrt.Session(conv_net())
    inputs = [batch(1 + i % 3, seed=i) for i in range(200)]
    expected = [session.run(None, feeds) for feeds in inputs]
    failures = []

    def worker(offset):
        for i in range(200):
            index = (i + offset * 25) % 200
            got = session.run(None, inputs[index])
            if not all(np.array_equal(g, e) for g, e in zip(got, expected[index])):
                failures.append(index)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert all(len(plan.pool) <= 8 for plan in session._plans.values())


def test_profiler_writes_a_chrome_trace(tmp_path):
    path = tmp_path / "trace.json"
    session = mixrt.Session(conv_net(), opt_level=0, profile=str(path))
    session.run(None, batch(2))
    session.run(None, batch(2))
    assert session.end_profiling() == str(path)
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {e["name"] for e in kernels} >= {"conv1", "relu1", "conv2", "skip", "softmax"}
    conv = next(e for e in kernels if e["name"] == "conv1")
    assert conv["ph"] == "X" and conv["dur"] > 0
    assert conv["args"]["op"] == "Conv"
    assert conv["args"]["input_shapes"][0] == [2, 3, 6, 6]
    assert conv["args"]["output_shapes"] == [[2, 8, 6, 6]]
    counters = [e for e in events if e.get("ph") == "C"]
    assert counters and counters[0]["args"]["arena_bytes"] > 0


def test_profile_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "env_trace.json"
    monkeypatch.setenv("MIXRT_PROFILE", str(path))
    session = mixrt.Session(conv_net())
    session.run(None, batch(1))
    session.run(None, batch(1))
    session.end_profiling()
    assert json.loads(path.read_text())["traceEvents"]


def test_bad_options_are_input_errors():
    with pytest.raises(InputError, match="opt_level"):
        mixrt.Session(conv_net(), opt_level=5)
    with pytest.raises(InputError, match="strategy"):
        mixrt.Session(conv_net(), strategy="magic")


def test_memory_plan_needs_feeds_for_symbolic_inputs():
    session = mixrt.Session(conv_net())
    with pytest.raises(InputError, match="no static shape"):
        session.memory_plan()
    assert mixrt.Session(conv_net(batch=2)).memory_plan().arena_bytes > 0


def reshape_by_computed_shape():
    """A transformer's head split: the Reshape target is Concat(Gather(Shape(x)), [4, -1])
    computed at run time, with a symbolic batch. Only the per-signature shape arithmetic
    tells inference the Reshape's output shape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["heads"]),
        helper.make_node("Mul", ["heads", "two"], ["scaled"]),
        helper.make_node("Exp", ["scaled"], ["e"]),
        helper.make_node("Softmax", ["e"], ["y"], axis=-1),
    ]
    initializers = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                    numpy_helper.from_array(np.array([0], np.int64), "axes"),
                    numpy_helper.from_array(np.array([4, -1], np.int64), "tail"),
                    numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    graph = helper.make_graph(
        nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_makes_later_slots_static():
    session = mixrt.Session(reshape_by_computed_shape(), opt_level=0)
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32) * 0.3
    first = session.run(None, {"x": x})[0]
    (plan,) = session._plans.values()
    assert set(plan.frozen) >= {"shape", "n", "n1", "target"}
    assert plan.slots["scaled"].static and plan.slots["e"].static  # out= buffers, in place
    np.testing.assert_allclose(session.run(None, {"x": x})[0], first, rtol=1e-6)
    expected = np.exp(np.exp(2 * x.reshape(3, 4, 2)))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(first, expected, rtol=1e-5)


def test_weights_arena_and_packed_weights_start_on_64_bytes():
    """Imported initializers (read-only as imported), the arena and a conv's prepacked
    weights all start on a 64-byte boundary: OpenBLAS read a misaligned weight 10-14%
    slower."""
    from mixrt.ops.device import ALIGNMENT, aligned
    session = mixrt.Session(conv_net().SerializeToString(), opt_level=2)
    for _ in range(2):  # the first run of a shape discovers it; the second runs its plan
        session.run(None, batch(2))
    constants = session._bound.constants
    assert all(value.ctypes.data % ALIGNMENT == 0 for value in constants.values())
    assert not any(value.flags.writeable for value in constants.values())
    arenas = [arena for plan in session._plans.values() for arena in plan.pool]
    assert arenas and all(arena.buffer.ctypes.data % ALIGNMENT == 0 for arena in arenas)
    # the helper: aligned arrays pass through, others are copied (keeping read-only)
    raw = np.empty(1000, np.uint8)
    odd = raw[(-raw.ctypes.data % ALIGNMENT) + 16:][:400].view(np.float32)
    odd[:] = np.arange(100)
    odd.flags.writeable = False
    fixed = aligned(odd)
    assert fixed.ctypes.data % ALIGNMENT == 0 and not fixed.flags.writeable
    np.testing.assert_array_equal(fixed, odd)
    assert aligned(fixed) is fixed
    # a weight a kernel prepacks in its node's dict is kept aligned too
    from mixrt.ops.compiled.workspace import packed
    kept = packed({}, "layout", lambda: odd)
    assert kept.ctypes.data % ALIGNMENT == 0
    np.testing.assert_array_equal(kept, odd)


def _reshape_chain():
    """x -> Relu -> Reshape -> Unsqueeze -> Squeeze -> Flatten -> Relu(-x) -> y: four
    reshapes of an arena tensor, their shapes fixed by the input's."""
    shape = numpy_helper.from_array(np.array([4, -1], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["a"]),
        helper.make_node("Unsqueeze", ["a", "axes"], ["b"]),
        helper.make_node("Squeeze", ["b", "axes"], ["c"]),
        helper.make_node("Flatten", ["c"], ["d"], axis=0),
        helper.make_node("Neg", ["d"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "reshapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_reshapes_of_known_shape_are_made_by_the_run_loop():
    """A planned run reshapes arena tensors itself when the plan knows the result's shape
    (ExecutionPlan.reshapes), with the kernels' results, for each signature."""
    session = mixrt.Session(_reshape_chain(), opt_level=0)
    for rows in (4, 8, 4):
        x = np.random.default_rng(rows).standard_normal((rows, 6)).astype(np.float32)
        expected = np.maximum(-np.maximum(x, 0).reshape(1, -1), 0)
        for _ in range(3):
            np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)
    from mixrt.runtime.feeds import feed_signature  # noqa: PLC0415
    plan = session._cached_plan(feed_signature({"x": x}))  # the last run's: 4 rows
    assert plan.reshapes == {"a": (4, 6), "b": (1, 4, 6), "c": (4, 6), "d": (1, 24)}


def test_a_reshape_the_plan_did_not_see_goes_to_its_kernel():
    """Should a run's tensor not have the size its plan saw, the kernel runs and its error
    names the node, as without the shortcut."""
    from mixrt.runtime import call_forms
    session = mixrt.Session(_reshape_chain(), opt_level=0)
    x = np.ones((4, 6), np.float32)
    session.run(None, {"x": x})
    plan = next(iter(session._plans.values()))
    plan.reshapes["a"] = (5, 7)  # what a wrong plan would hold
    for arena in plan.pool:
        arena.calls = None
    calls = call_forms.arena_calls(plan.pool[0], plan)
    form = next(call[4] for call in calls if call[0].node.outputs[0] == "a")
    assert form[0] == -1 and form[3] == (5, 7)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.zeros((1, 24)))


def test_split_parts_are_views_of_their_input_not_slots():
    """Split's outputs are slices of its input: no slot (and no copy into one) of their own,
    and the input's slot lives until the last part is read, so a later tensor never takes
    its bytes while a part is still to be read."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r"], ["p", "q", "s"], axis=1, num_outputs=3),
             helper.make_node("Neg", ["p"], ["np"]),
             helper.make_node("Exp", ["np"], ["e"]),  # made while s is yet to be read
             helper.make_node("Add", ["e", "q"], ["eq"]),
             helper.make_node("Mul", ["eq", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    session = mixrt.Session(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 18)]), opt_level=0)
    x = np.random.default_rng(5).standard_normal((2, 12)).astype(np.float32)
    r = np.maximum(x, 0)
    expected = (np.exp(-r[:, :4]) + r[:, 4:8]) * r[:, 8:]
    for _ in range(3):
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-6)
    plan = next(iter(session._plans.values()))
    lives = {life.name: life for life in plan.memory.lifetimes}
    assert "r" in lives and not lives.keys() & {"p", "q", "s"}
    assert lives["r"].last == 5  # the Mul, the sixth step, reads its last part


def test_reshapes_of_strings_are_made_by_the_run_loop_too():
    """A text model's reshapes (strings never live in the arena) take the same shortcut
    when the plan knows their shape, and answer as the kernel would."""
    shape = numpy_helper.from_array(np.array([-1], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("StringNormalizer", ["flat"], ["y"], case_change_action="UPPER")]
    graph = helper.make_graph(
        nodes, "text", [helper.make_tensor_value_info("x", TensorProto.STRING, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)], [shape])
    session = mixrt.Session(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]), opt_level=0)
    for text in ("one two", "three", "one two"):
        got = session.run(None, {"x": np.array([[text]], dtype=object)})[0]
        np.testing.assert_array_equal(got, np.array([text.upper()], dtype=object))
    plan = next(iter(session._plans.values()))
    assert plan.reshapes == {"flat": (1,)}


def test_a_structure_asks_a_plan_from_inference_only_what_its_sizes_may_change(monkeypatch):
    """PlanStructure.holds_for(from_inference=True): a yes to "predicted" or "plannable"
    for a value inference shaped with elements holds unasked; an empty one, a no, and a
    graph output's size are asked, the output's first."""
    from mixrt.runtime import executor  # noqa: PLC0415

    asked = []

    def probe(kind, step, name, observed, inferred, plannable):
        asked.append((kind, name))
        return executor._plannable_on_cpu(observed[name]) if kind == "plannable" \
            else kind != "predicted" or name != "mispredicted"
    monkeypatch.setattr(executor, "_probe", probe)
    structure = executor.PlanStructure(
        steps=[], slots=[], candidates=[], reshapes=(), views=frozenset(),
        detached=frozenset(), shared=frozenset(),
        probes=[("predicted", None, "a", True), ("plannable", None, "a", True),
                ("plannable", None, "empty", True), ("predicted", None, "mispredicted", False),
                ("arena output", None, "out", True)])
    f32 = np.dtype(np.float32)
    values = {"a": executor.Shaped((2, 3), f32), "empty": executor.Shaped((0, 3), f32),
              "mispredicted": executor.Shaped((1,), f32), "out": executor.Shaped((4,), f32)}
    cpu = executor._plannable_on_cpu
    assert not structure.holds_for(values, {}, cpu, from_inference=True)  # "empty" says no
    assert asked == [("arena output", "out"), ("plannable", "empty")]
    asked.clear()
    values["empty"] = executor.Shaped((1, 3), f32)
    assert structure.holds_for(values, {}, cpu, from_inference=True)
    assert asked == [("arena output", "out"), ("predicted", "mispredicted")]
    asked.clear()
    assert structure.holds_for(values, {}, cpu)  # a discovered plan's values: all asked
    assert len(asked) == 5


def test_large_host_buffers_are_mappings_of_their_own_on_the_system_pages():
    """From 4 MiB (where NumPy asks for transparent huge pages, whose faults may compact
    memory in a request) a host buffer is a private anonymous mapping: page-aligned,
    zeroed, writable, apart from every other, and gone with its last array; smaller ones
    come from NumPy as before, on 64 bytes."""
    import mmap
    import weakref
    from mixrt.ops import device
    big, other = device.aligned_empty(device.OWN_PAGES_FROM), device.aligned_empty(5 << 20)
    assert big.ctypes.data % mmap.PAGESIZE == 0 and big.flags.writeable
    assert big.size == device.OWN_PAGES_FROM and not big.any()
    big[:] = 7
    assert not other.any() and not np.shares_memory(big, other)
    region = weakref.ref(big.base.obj)
    view = big[100:200].view(np.float32)
    del big
    assert region() is not None and view.size == 25  # held by the view
    del view
    assert region() is None or region().closed
    small = device.aligned_empty(1000)
    assert small.ctypes.data % device.ALIGNMENT == 0 and isinstance(small.base, np.ndarray)
