"""A CPU session's repeated run takes the steady lane (runtime/steady_run.py) and answers as
the full path does: the same values, fresh outputs, and the full path again wherever
something the lane settled has changed (the feeds' shapes, the outputs asked for, a
profiler, the kernel tier)."""

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt import profiler
from mixrt.runtime import steady_run
from mixrt.runtime.steady_run import SteadyRun


def _model():
    """y = relu(x) * 2 + b, z = x + b: two outputs, one of them an arena-planned tensor."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Mul", ["r", "two"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"]),
             helper.make_node("Add", ["x", "b"], ["z"])]
    graph = helper.make_graph(
        nodes, "steady", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("b", TensorProto.FLOAT, [4], [0.5, -1.0, 2.0, 0.0])])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def _expected(x):
    b = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    return [np.maximum(x, 0) * 2 + b, x + b]


@pytest.fixture
def lane_runs(monkeypatch):
    """How many runs the steady lane carried out."""
    runs = []
    run = SteadyRun.run

    def counted(self, feeds):
        runs.append(self)
        return run(self, feeds)

    monkeypatch.setattr(SteadyRun, "run", counted)
    return runs


def _feeds(rows, seed):
    return {"x": np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)}


def test_repeated_runs_take_the_lane_and_answer_as_the_full_path(lane_runs):
    session = mixrt.Session(_model().SerializeToString())
    first = _feeds(3, 0)
    for got, want in zip(session.run(None, first), _expected(first["x"])):
        np.testing.assert_array_equal(got, want)
    assert not lane_runs
    answers = []
    for seed in range(1, 4):
        feeds = _feeds(3, seed)
        answers.append((feeds, session.run(None, feeds)))
    assert len(lane_runs) == 3
    for feeds, outputs in answers:  # each run's outputs are its own (no arena reuse)
        for got, want in zip(outputs, _expected(feeds["x"])):
            np.testing.assert_array_equal(got, want)


def test_new_shapes_and_chosen_outputs_take_the_full_path(lane_runs):
    session = mixrt.Session(_model().SerializeToString())
    session.run(None, _feeds(3, 0))
    session.run(None, _feeds(3, 1))
    assert len(lane_runs) == 1
    feeds = _feeds(5, 2)
    (z,) = session.run(["z"], feeds)
    np.testing.assert_array_equal(z, _expected(feeds["x"])[1])
    assert len(lane_runs) == 1  # outputs chosen: the full path (which sets up its lane)
    y, z = session.run(None, feeds)
    assert len(lane_runs) == 2 and lane_runs[-1].key[0][1] == (5, 4)
    np.testing.assert_array_equal(y, _expected(feeds["x"])[0])
    np.testing.assert_array_equal(z, _expected(feeds["x"])[1])



def test_a_service_cycling_through_batch_sizes_keeps_a_lane_for_each(lane_runs):
    """Batch sizes that come back each find their own lane, with their own answers."""
    session = mixrt.Session(_model().SerializeToString())
    sizes = (1, 3, 8, 5)
    for size in sizes:  # each size's first run takes the full path, which makes its lane
        session.run(None, _feeds(size, 0))
    assert not lane_runs
    for turn in range(3):
        for size in sizes:
            feeds = _feeds(size, turn + 1)
            for got, want in zip(session.run(None, feeds), _expected(feeds["x"])):
                np.testing.assert_array_equal(got, want)
    assert len(lane_runs) == 3 * len(sizes)
    assert {run.key[0][1] for run in lane_runs} == {(size, 4) for size in sizes}


def test_a_plan_the_cache_lets_go_takes_its_lane_along(monkeypatch):
    from mixrt.runtime import session as session_module  # noqa: PLC0415
    monkeypatch.setattr(session_module, "MAX_CACHED_PLANS", 2)
    session = mixrt.Session(_model().SerializeToString())
    for size in (1, 2, 3, 4):
        session.run(None, _feeds(size, 0))
        session.run(None, _feeds(size, 1))  # the lane's first run
    kept = [id(steady.plan) for steady in session._steady_runs.values()]
    assert sorted(kept) == sorted(id(plan) for plan in session._plans.values())
    assert len(kept) == 2

def test_a_running_profiler_sees_the_runs_the_lane_would_take(lane_runs, tmp_path):
    session = mixrt.Session(_model().SerializeToString())
    for seed in range(2):
        session.run(None, _feeds(2, seed))
    assert len(lane_runs) == 1
    profiler.set_config(filename=str(tmp_path / "trace.json"), aggregate_stats=True)
    profiler.set_state("run")
    try:
        session.run(None, _feeds(2, 5))
    finally:
        profiler.set_state("stop")
    assert len(lane_runs) == 1
    assert "Add" in profiler.dumps(reset=True)  # the profiler saw the kernels
    session.run(None, _feeds(2, 6))
    assert len(lane_runs) == 2


def test_a_profiling_session_never_takes_the_lane(lane_runs, tmp_path):
    session = mixrt.Session(_model().SerializeToString(), profile=True)
    for seed in range(3):
        session.run(None, _feeds(2, seed))
    assert not lane_runs


def test_threads_share_the_lane(lane_runs):
    session = mixrt.Session(_model().SerializeToString())
    session.run(None, _feeds(4, 0))
    failures = []

    def serve(seed):
        for step in range(20):
            feeds = _feeds(4, seed * 100 + step)
            for got, want in zip(session.run(None, feeds), _expected(feeds["x"])):
                if not np.array_equal(got, want):
                    failures.append(seed)

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert len(lane_runs) == 80


def test_a_run_takes_its_last_runs_bound_calls_until_what_they_were_bound_under_changes(
        monkeypatch):
    """The lane takes the bound calls its last run took without asking again what they
    were bound under (the thread's tier and scratch buffers, the native pool's settings,
    the feeds' layout), until any of those may have changed: a change of any thread's
    tier or scratch buffers (jit_tier.CHANGES), another thread, other settings, feeds out
    of order. Every run answers as the full path does."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    from mixrt.runtime import steady_run  # noqa: PLC0415
    asked = []  # a bound_key per run that asked what its calls are bound under
    real_key = steady_run.bound_key
    monkeypatch.setattr(steady_run, "bound_key", lambda *a: asked.append(1) or real_key(*a))
    session = mixrt.Session(_model().SerializeToString())

    def asks(feeds) -> bool:
        """Did a run of ``feeds`` ask for its key? (It answers as the full path does.)"""
        del asked[:]
        for got, want in zip(session.run(None, feeds), _expected(feeds["x"])):
            np.testing.assert_array_equal(got, want)
        return bool(asked)

    for seed in range(4):  # planned, run unbound, bound, settled
        asks(_feeds(5, seed))
    assert not asks(_feeds(5, 9))
    jit_tier.note_change()  # any thread's tier or scratch buffers
    assert asks(_feeds(5, 10)) and not asks(_feeds(5, 11))
    with jit_tier.using(False):  # this thread's tier, changed and back: asked again
        pass
    assert asks(_feeds(5, 12)) and not asks(_feeds(5, 13))
    with jit_tier.using(True):  # no change
        pass
    assert not asks(_feeds(5, 14))
    columns = np.asfortranarray(_feeds(5, 15)["x"])  # out of order: never settled
    assert asks({"x": columns}) and asks({"x": columns})
    assert not asks(_feeds(5, 16))
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")  # another native pool
    assert asks(_feeds(5, 17))
    monkeypatch.delenv("MIXRT_INTRA_OP_THREADS")
    assert not asks(_feeds(5, 18))  # the settings those calls were bound under, again
    # another thread (where runs are carried out depends on the BLAS gate's state, so
    # the thread's id is what changes here)
    monkeypatch.setattr(steady_run, "get_ident", lambda: -1)
    assert asks(_feeds(5, 19)) and asks(_feeds(5, 20))


def _pipeline_model():
    """Scaler then Normalizer, as a scikit-learn pipeline's: kernels whose bound calls
    raise no NumPy warning (bound_calls.binds(silent=True))."""
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml",
                              offset=[0.5, -1.0, 2.0, 0.0], scale=[2.0, 0.5, -1.0, 3.0]),
             helper.make_node("Normalizer", ["s"], ["y"], domain="ai.onnx.ml", norm="L1")]
    graph = helper.make_graph(
        nodes, "pipeline", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def test_numpys_error_state_is_quieted_unless_every_settled_step_is_silent(monkeypatch):
    """A settled run whose every step is a bound call that raises no NumPy warning enters
    no quiet error state; any other run does, so an overflow in a NumPy step still warns
    nothing, run after run, as on the full path."""
    import warnings  # noqa: PLC0415
    from mixrt.ops.compiled import jit_cpu  # noqa: PLC0415
    from mixrt.runtime import steady_run  # noqa: PLC0415
    quieted = []
    real_enter = steady_run.quiet_enter
    monkeypatch.setattr(steady_run, "quiet_enter", lambda: quieted.append(1) or real_enter())
    pipeline = mixrt.Session(_pipeline_model().SerializeToString())
    pipeline.wait_compiled()
    x = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    rows = (x - np.float32([0.5, -1.0, 2.0, 0.0])) * np.float32([2.0, 0.5, -1.0, 3.0])
    for _ in range(6):
        del quieted[:]
        (y,) = pipeline.run(None, {"x": x})
        np.testing.assert_allclose(y, rows / np.abs(rows).sum(axis=1, keepdims=True),
                                   rtol=1e-6)
    if jit_cpu.enabled():  # the compiled kernels are bound: the last runs settled
        assert not quieted
    session = mixrt.Session(_model().SerializeToString())
    huge = np.full((2, 4), 3e38, np.float32)  # relu(x) * 2 overflows in NumPy's multiply
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for run in range(6):
            del quieted[:]
            y, _ = session.run(None, {"x": huge})
            assert np.isinf(y[:, 0]).all()
            assert quieted or run == 0  # the first run takes the full path


def _mlp_model(rows_in: int = 24, hidden: int = 40, rows_out: int = 72):
    """Gemm, a GELU written out (Div, Erf, Add, Mul, Mul) and Gemm, as PyTorch exports an
    MLP: the products and the compiled chain are replays bound as compiled calls alone."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(size=(hidden, rows_in)).astype(np.float32)
    w2 = rng.normal(size=(rows_out, hidden)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Div", ["h", "root2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["h", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]),
             helper.make_node("Gemm", ["g", "w2", "b2"], ["y"], transB=1)]
    constants = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                 numpy_helper.from_array(rng.normal(size=hidden).astype(np.float32), "b1"),
                 numpy_helper.from_array(rng.normal(size=rows_out).astype(np.float32), "b2"),
                 helper.make_tensor("root2", TensorProto.FLOAT, [], [2 ** 0.5]),
                 helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
                 helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", rows_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", rows_out])], constants)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def test_a_settled_mlp_of_compiled_replays_enters_no_quiet_state(monkeypatch):
    """The products' and the compiled chain's replays are recorded as compiled calls alone
    (``replay.record(silent=True)``): a settled run of them enters no NumPy quiet state,
    warns of nothing where values overflow, and matches onnxruntime."""
    import warnings  # noqa: PLC0415
    from mixrt.ops.compiled import jit_cpu  # noqa: PLC0415
    from mixrt.runtime import steady_run  # noqa: PLC0415
    ort = pytest.importorskip("onnxruntime")
    quieted = []
    real_enter = steady_run.quiet_enter
    monkeypatch.setattr(steady_run, "quiet_enter", lambda: quieted.append(1) or real_enter())
    model = _mlp_model().SerializeToString()
    session = mixrt.Session(model)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(8).normal(size=(3, 24)).astype(np.float32)
    for _ in range(4):
        session.run(None, {"x": x})
    session.wait_compiled()
    for _ in range(6):
        del quieted[:]
        (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, reference.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    if not jit_cpu.enabled() or jit_cpu.panel_kernels() is None:
        return  # (the NumPy tier: its calls are not compiled ones)
    assert not quieted
    huge = np.full((3, 24), 3e38, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            (y,) = session.run(None, {"x": huge})
    assert not np.isfinite(y).all()


def test_a_bad_feed_still_gets_the_full_paths_error():
    session = mixrt.Session(_model().SerializeToString())
    session.run(None, _feeds(2, 0))
    session.run(None, _feeds(2, 1))
    with pytest.raises(mixrt.errors.InputError, match="x"):
        session.run(None, {"x": np.ones((2, 3), np.float32)})
    with pytest.raises(mixrt.errors.InputError):
        session.run(None, {"x": np.ones((2, 4), np.float32), "extra": np.ones(1)})


def test_text_feeds_take_the_lane_as_object_strings(lane_runs):
    """NumPy unicode text (what a caller usually has) is run as object strings, as the full
    path converts it, in the lane too."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER")]
    graph = helper.make_graph(
        nodes, "text", [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    session = mixrt.Session(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString())
    for words in (["Warm", "FAST"], ["Cold", "Slow"], ["WaRm", "fAsT"]):
        got = session.run(None, {"x": np.array(words)})[0]  # dtype '<U4'
        assert got.dtype == object and got.tolist() == [w.lower() for w in words]
    assert len(lane_runs) == 2


def test_a_session_is_freed_as_soon_as_its_caller_lets_it_go():
    """No reference cycle runs through a session that ran (its lanes, its plan cache): its
    arenas go back when the caller drops it, not at the collector's next full pass."""
    import gc  # noqa: PLC0415
    import weakref  # noqa: PLC0415
    session = mixrt.Session(_model().SerializeToString())
    for size in (3, 3, 5, 5):
        session.run(None, _feeds(size, 0))
    gone = weakref.ref(session)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del session
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


def _product_model(inner=384):
    """y = x @ w: a product the native workers split, its rows free."""
    w = np.random.default_rng(3).normal(size=(inner, inner)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", inner])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)]), w


def _split_product_lane(monkeypatch, seed: int):
    """A session of :func:`_product_model` on two intra-op threads, run compiled until its
    rows' lane wakes the native workers: (session, x, w, its first product, the lane); skipped
    where there is no native pool or the product does not split here."""
    from mixrt.ops.compiled import jit_cpu  # noqa: PLC0415
    from mixrt.runtime.session_feeds import feed_key  # noqa: PLC0415
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    if jit_cpu.native_pool() is None:
        pytest.skip("no native worker pool here (one thread, or no panel kernels)")
    model, w = _product_model()
    session = mixrt.Session(model.SerializeToString())
    x = np.random.default_rng(seed).normal(size=(48, w.shape[0])).astype(np.float32)
    session.run(None, {"x": x})
    assert session.wait_compiled(timeout=600)
    first = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(first, x @ w, rtol=1e-4, atol=1e-3)
    lane = session._steady_runs[feed_key({"x": x})]
    if not lane.plan.wakes_workers:
        pytest.skip("this machine's product of that size did not split")
    return session, x, w, first, lane


def test_runs_that_find_the_workers_asleep_time_both_ways_and_answer_alike(monkeypatch):
    """Requests paced past the workers' spin find them asleep: the plan's runs time waking
    them and running alone (ops/compiled/worker_wakes.py), and give the same bits either way."""
    from mixrt.ops.compiled.worker_wakes import LEARN, TRY_ALONE_BELOW_S  # noqa: PLC0415
    session, x, _, first, lane = _split_product_lane(monkeypatch, seed=4)
    choice, deadline = lane.plan.wake_choice, time.monotonic() + 30
    while choice.state()["asleep_runs"] < 2 * LEARN + 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # past the workers' 50 us spin
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], first)
    state = choice.state()
    assert len(state["woken"]) >= LEARN, state
    woken = sorted(state["woken"])[len(state["woken"]) // 2]
    assert (len(state["alone"]) >= LEARN) == (woken < TRY_ALONE_BELOW_S), state


def test_a_plan_whose_runs_hand_the_workers_no_job_stops_waking_them(monkeypatch):
    """A settled run that wakes the workers and hands them no job (a forest's walk the
    clock keeps whole) counts toward IDLE_RUNS, after which the plan's runs no longer wake
    them; a run that hands them a job takes it up again. A product that splits on every
    run keeps it; a product too small to split, its plan told to wake them, stops. The
    answers are the same bits throughout."""
    from mixrt.runtime.session_feeds import feed_key  # noqa: PLC0415
    session, x, _, first, lane = _split_product_lane(monkeypatch, seed=6)
    for _ in range(2 * steady_run.IDLE_RUNS):  # back to back: its parts go to the workers
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], first)
    assert lane.plan.wakes_workers
    model, w = _product_model(inner=16)
    session = mixrt.Session(model.SerializeToString())
    row = x[:2, :16].copy()
    session.run(None, {"x": row})
    assert session.wait_compiled(timeout=600)
    one = session.run(None, {"x": row})[0]
    for _ in range(3):  # settled
        session.run(None, {"x": row})
    small = session._steady_runs[feed_key({"x": row})]
    assert not small.plan.wakes_workers  # (too small to split)
    small.plan.wakes_workers = True  # as a plan that split once learns it
    for _ in range(steady_run.IDLE_RUNS - 1):
        np.testing.assert_array_equal(session.run(None, {"x": row})[0], one)
    assert small.plan.wakes_workers
    for _ in range(2):
        np.testing.assert_array_equal(session.run(None, {"x": row})[0], one)
    assert not small.plan.wakes_workers
    small._judge_workers(True)  # a run that handed them a job
    assert small.plan.wakes_workers
    np.testing.assert_allclose(one, row @ w, rtol=1e-4, atol=1e-3)


def test_a_plan_stops_waking_workers_where_its_settings_have_none(monkeypatch):
    """With one intra-op thread there is no native pool: a plan that would wake its
    workers learns there are none (its lane looked for the pool on every run), and its
    runs answer as before."""
    from mixrt.ops.compiled import jit_cpu  # noqa: PLC0415
    session, x, w, _, lane = _split_product_lane(monkeypatch, seed=5)
    for _ in range(2):
        np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ w, rtol=1e-4, atol=1e-3)
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")
    looked = []
    real = steady_run.SteadyRun._workers_begin
    # (the lane's start looks for the pool; a node's replay asks for it as loaded too)
    monkeypatch.setattr(steady_run.SteadyRun, "_workers_begin",
                        lambda self, key: looked.append(1) or real(self, key))
    for run in range(4):
        del looked[:]
        np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ w, rtol=1e-4, atol=1e-3)
    assert not lane.plan.wakes_workers
    assert not looked  # the last runs looked for no pool
    assert jit_cpu.loaded_native_pool() is None  # (none for these settings)


def _lone_classifier(kind: str):
    """A lone scikit-learn-style classifier over 3 features: its label and scores are the
    graph's outputs (the linear one's in the other order), made anew by its bound call
    (bound_calls.binds(fresh=True)); with ``passthrough``, the feed is a graph output too."""
    if kind == "linear":
        node = helper.make_node(
            "LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
            classlabels_ints=[4, 7, 9], coefficients=[0.5, -1.0, 2.0, 1.0, 0.0, -0.5, -1.0,
                                                      1.0, 0.25],
            intercepts=[0.0, 0.1, -0.1], post_transform="SOFTMAX")
    else:  # two stumps, a row each: (tree, node, feature, threshold, mode, true, false)
        rows = [(0, 0, 1, -0.25, "BRANCH_LT", 1, 2), (0, 1, 0, 0.0, "LEAF", 0, 0),
                (0, 2, 0, 0.0, "LEAF", 0, 0), (1, 0, 2, 0.75, "BRANCH_GTE", 1, 2),
                (1, 1, 0, 0.0, "LEAF", 0, 0), (1, 2, 0, 0.0, "LEAF", 0, 0)]
        trees, ids, features, thresholds, modes, true_ids, false_ids = map(list, zip(*rows))
        node = helper.make_node(
            "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
            classlabels_int64s=[0, 1], nodes_treeids=trees, nodes_nodeids=ids,
            nodes_featureids=features, nodes_values=thresholds, nodes_modes=modes,
            nodes_truenodeids=true_ids, nodes_falsenodeids=false_ids,
            class_treeids=[0, 0, 1, 1], class_nodeids=[1, 2, 1, 2], class_ids=[1, 1, 1, 1],
            class_weights=[0.35, 0.6, 0.15, 0.5], post_transform="LOGISTIC")
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", None])]
    if kind == "linear":  # the graph's outputs in another order than the node's
        outputs.reverse()
    if kind == "passthrough":
        outputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]))
    graph = helper.make_graph(
        [node], "lone", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


@pytest.fixture
def one_calls(monkeypatch):
    """Each run's answer from steady_run.OneCall: True where the one call made it."""
    from mixrt.runtime import steady_run  # noqa: PLC0415
    made = []
    real = steady_run.OneCall.run

    def counted(self, *args):
        found = real(self, *args)
        made.append(found is not None)
        return found
    monkeypatch.setattr(steady_run.OneCall, "run", counted)
    return made


@pytest.mark.parametrize("kind", ["tree", "linear"])
def test_a_lone_classifiers_settled_run_is_its_one_call(kind, one_calls, monkeypatch):
    """Once settled, a lone classifier's run is its bound call alone, answering as the full
    path does with new arrays every run; a run it does not hold for (feeds out of order, a
    run limit, another thread, a changed tier) takes the lane and answers alike."""
    from mixrt.ops.compiled import jit_cpu, jit_tier  # noqa: PLC0415
    from mixrt.runtime import run_loop, steady_run  # noqa: PLC0415
    session = mixrt.Session(_lone_classifier(kind).SerializeToString())
    reference = mixrt.Session(_lone_classifier(kind).SerializeToString())
    session.wait_compiled()
    rng = np.random.default_rng(7)

    def answers(x, **run) -> bool:
        """Does the one call answer ``x``'s run (as the full path does)?"""
        del one_calls[:]
        got = session.run(None, {"x": x}, **run)
        monkeypatch.setattr(run_loop, "BIND", False)
        want = reference.run(None, {"x": x})
        monkeypatch.setattr(run_loop, "BIND", True)
        for found, expected in zip(got, want):
            np.testing.assert_array_equal(found, expected)
        return any(one_calls)

    x = rng.normal(size=(5, 3)).astype(np.float32)
    kept = []
    for _ in range(4):  # planned, unbound, bound, settled
        answers(x)
    for run in range(4):
        x = rng.normal(size=(5, 3)).astype(np.float32)
        assert answers(x) or not jit_cpu.enabled()
        kept.append([(value, value.copy()) for value in session.run(None, {"x": x})])
    for outputs in kept:  # each run's arrays its own: no later run wrote into them
        for value, then in outputs:
            np.testing.assert_array_equal(value, then)
    if not jit_cpu.enabled():
        return
    assert not answers(np.asfortranarray(rng.normal(size=(5, 3)).astype(np.float32)))
    limited = mixrt.RunOptions(timeout=60.0)  # a limit: checked as the lane checks it
    assert not answers(rng.normal(size=(5, 3)).astype(np.float32), run_options=limited)
    jit_tier.note_change()  # the lane settles its calls again, then the one call
    assert [answers(x) for _ in range(2)] == [False, True]
    monkeypatch.setattr(steady_run, "get_ident", lambda: -1)  # another thread
    assert not answers(x)


def test_a_plan_whose_outputs_the_step_does_not_all_make_takes_the_lane(one_calls):
    session = mixrt.Session(_lone_classifier("passthrough").SerializeToString())
    session.wait_compiled()
    x = np.random.default_rng(8).normal(size=(4, 3)).astype(np.float32)
    for _ in range(6):
        label, scores, fed = session.run(None, {"x": x})
        np.testing.assert_array_equal(fed, x)
    assert not any(one_calls)
    assert all(run._one is None for run in session._steady_runs.values())
