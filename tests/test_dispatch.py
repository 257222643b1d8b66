"""The cost between kernels: a planned CPU run's host loop, the session's per-run checks, the
run gate's background runs and FusedElementwise's generated small-output functions keep every
behaviour they replaced: the same bits, typed errors naming the node, profiler events,
fresh feed checks whenever the feeds change, one arena per concurrent run."""

from __future__ import annotations

import json
import threading

import mixrt  # noqa: F401  (before NumPy: mixrt's BLAS policy)
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixrt.errors import ExecutionError, InputError
from mixrt.ops.compiled import jit_cpu, parallel
from mixrt.ops.elementwise import fused_elementwise, jit_elementwise
from mixrt.ops.elementwise.elementwise import quiet, quiet_numpy
from mixrt.ops.elementwise.fused_elementwise import OPS, Program
from mixrt.ops.elementwise.simd_cpu import filled
from mixrt.runtime import kernel_tiers
from mixrt.runtime.blas_threads import BlasGate
from mixrt.runtime.session import Session

UNARY_MATH = ["Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
              "Atanh"]
DTYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def model(nodes, shape, dtype=np.float32, inputs=("x",), initializers=(), opset=17):
    elem = DTYPES[dtype]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, elem, list(shape)) for n in inputs],
        [helper.make_tensor_value_info("y", elem, None)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8).SerializeToString()


def chain(ops, shape, dtype=np.float32):
    """x -> ops[0] -> ops[1] -> ... -> y (Add as x + x)."""
    nodes, previous = [], "x"
    for i, op in enumerate(ops):
        output = "y" if i == len(ops) - 1 else f"t{i}"
        inputs = [previous, previous] if op == "Add" else [previous]
        nodes.append(helper.make_node(op, inputs, [output], name=f"{op.lower()}{i}"))
        previous = output
    return model(nodes, shape, dtype)


def op_types(session) -> list[str]:
    return [n.op_type for n in session.graph.nodes]


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def within_ulps(a, b, ulps: int) -> bool:
    """Same dtype, shape, NaNs and infinities, and finite values at most ``ulps`` apart."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    finite = np.isfinite(b)
    if not (np.array_equal(np.isnan(a), np.isnan(b))
            and np.array_equal(a[~finite & ~np.isnan(b)], b[~finite & ~np.isnan(b)])):
        return False
    gap = np.abs(a[finite].astype(np.float64) - b[finite])
    return bool((gap <= ulps * np.spacing(np.abs(b[finite]))).all())


# -- the unary math ops fuse, with the unfused bits ----------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 16), (64, 300), (3, 70000)])
def test_fused_unary_math_chains_give_the_unfused_bits(shape, dtype):
    ops = UNARY_MATH + ["Exp", "Add", "Relu", "Sin", "Neg", "Tanh"]
    graph = chain(ops, shape, dtype)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 0.4).astype(dtype)
    x.flat[:4] = [np.nan, np.inf, -np.inf, 2.5]  # NaN where Asin/Acosh/Atanh leave the domain
    unfused = Session(graph, opt_level=0)
    fused = Session(graph, opt_level=2)
    assert op_types(fused) == ["FusedElementwise"]
    assert "FusedElementwise" not in op_types(unfused)
    want = unfused.run(None, {"x": x})[0]
    for _ in range(3):  # the discovery run's answer, then planned runs
        got = fused.run(None, {"x": x})[0]
        if dtype == np.float32:
            # a fused float32 Tanh is a vectorising rational within 6 ulp of tanhf
            # (ops/elementwise/odd_rational.py); every step before it gives the unfused bits
            assert within_ulps(got, want, 8)
        else:
            assert same_bits(got, want)


@pytest.mark.parametrize("op", UNARY_MATH)
def test_each_new_step_matches_its_ufunc(op):
    x = np.linspace(-0.9, 0.9, 40, dtype=np.float32).reshape(4, 10) + np.float32(
        1.5 if op == "Acosh" else 0.0)
    unfused = Session(chain([op, "Neg"], x.shape), opt_level=0).run(None, {"x": x})[0]
    fused = Session(chain([op, "Neg"], x.shape), opt_level=2)
    assert op_types(fused) == ["FusedElementwise"]
    assert same_bits(fused.run(None, {"x": x})[0], unfused)
    assert OPS[op].cuda("a").endswith("(a)")  # the GPU program calls CUDA's function


# -- generated small-output functions against the block path ---------------------------------------

PROGRAMS = [
    # (ops, operands, params, inputs, input shapes)
    (["Sin"] * 30, list(range(30)), [], 1, [(2, 8)]),
    (["Add", "Mul", "Sub", "Relu", "Max"], [0, 1, 2, 0, 3, 1, 4, 5, 2], [], 2, [(3, 5), (5,)]),
    (["Scalar", "Mul", "Exp", "Add", "Div", "Sqrt"], [0, 2, 3, 4, 1, 5, 3, 6], [0.5], 2,
     [(4, 6), (4, 1)]),
    (["Clip", "Pow", "Sigmoid", "LeakyRelu", "HardSigmoid", "Erf", "Min"],
     [0, 1, 2, 3, 4, 5, 6, 0], [-1.0, 1.5, 2.0, 0.1, 0.3, 0.4], 1, [(7, 9)]),
    (["Mul", "Add", "Tanh", "Mul"], [0, 0, 2, 1, 3, 4, 2], [], 2, [(1, 6), (6, 6)]),
    (["Abs", "Log", "Cosh", "Floor", "Ceil", "Reciprocal"], [0, 1, 2, 3, 4, 5], [], 1,
     [(5, 5)]),
]


def blocked(compiled: Program, inputs, out=None):
    """The program the way it ran before the generated functions (one block)."""
    if out is None:
        out = np.empty(np.broadcast_shapes(*(x.shape for x in inputs)), inputs[0].dtype)
    with np.errstate(all="ignore"):
        return compiled._run_block(list(inputs), out, [])


@pytest.mark.parametrize("case", range(len(PROGRAMS)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generated_functions_give_the_block_path_bits(case, dtype):
    ops, operands, params, count, shapes = PROGRAMS[case]
    compiled = Program(tuple(ops), tuple(operands), tuple(params), count)
    rng = np.random.default_rng(case)
    inputs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    want = blocked(compiled, [x.copy() for x in inputs])
    if jit_elementwise.costly(compiled.steps) and jit_cpu.enabled() \
            and jit_elementwise.compilable(compiled.steps, inputs[0].dtype):
        # a rational's or a power's program runs compiled at any size (min_elements)
        assert compiled.routine(inputs, None) is None
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(compiled.run_cpu(inputs), want, rtol=1e-5, atol=1e-6)
        return
    assert compiled.routine(inputs, None) is not None
    with np.errstate(all="ignore"):
        assert same_bits(compiled.run_cpu(inputs), want)  # out made there
        out = np.empty_like(want)
        assert compiled.run_cpu(inputs, out) is out and same_bits(out, want)
        if inputs[0].shape == want.shape:  # in place over the first input
            first = inputs[0].copy()
            again = [first] + inputs[1:]
            assert compiled.run_cpu(again, first) is first and same_bits(first, want)
    assert len(compiled.routines) >= 1


def test_generated_functions_step_aside_for_other_operands():
    compiled = Program(("Add",), (0, 1), (), 2)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones(4, np.float32)
    assert compiled.routine([a, b.astype(np.float64)], None) is None  # two dtypes
    assert compiled.routine([a, b], np.empty((4, 3), np.float32).T) is None  # strided out
    shifted = np.zeros(13, np.float32)
    assert compiled.routine([shifted[:12].reshape(3, 4), b], shifted[1:].reshape(3, 4)) \
        is None  # out partly over an input
    big = np.zeros((4, 1 << 16), np.float32)
    assert compiled.routine([big, big], None) is None  # blocks or a compiled loop
    # the general path still computes every one of them
    out = np.empty((4, 3), np.float32).T
    np.testing.assert_array_equal(compiled.run_cpu([a, b], out), a + b)
    np.testing.assert_array_equal(compiled.run_cpu([a, b.astype(np.float64)]), a + b)


def test_a_node_keeps_its_decoded_program():
    node: dict = {}
    x = np.ones((2, 3), np.float32)
    attributes = dict(ops=["Neg", "Exp"], operands=[0, 1], params=[], _node=node)
    first = fused_elementwise.fused_elementwise(np, x, **attributes)
    assert isinstance(node[fused_elementwise.PROGRAM], Program)
    np.testing.assert_array_equal(first, np.exp(-x))
    kept = node[fused_elementwise.PROGRAM]
    fused_elementwise.fused_elementwise(np, x, **attributes)
    assert node[fused_elementwise.PROGRAM] is kept


def test_concurrent_runs_of_one_fused_node_do_not_share_temporaries():
    # a DAG with temporaries: (x * 2 + 1) * tanh(x), each run with its own input
    graph = model([
        helper.make_node("Mul", ["x", "two"], ["a"]),
        helper.make_node("Add", ["a", "one"], ["b"]),
        helper.make_node("Tanh", ["x"], ["c"]),
        helper.make_node("Mul", ["b", "c"], ["y"]),
    ], (4, 8), initializers=[numpy_helper.from_array(np.float32(2.0), "two"),
                             numpy_helper.from_array(np.float32(1.0), "one")])
    session = Session(graph)
    assert op_types(session) == ["FusedElementwise"]
    feeds = [np.full((4, 8), i / 10, np.float32) for i in range(8)]
    wanted = [session.run(None, {"x": x})[0] for x in feeds]  # the same node, serially
    failures = []

    def worker(index):
        for _ in range(200):
            got = session.run(None, {"x": feeds[index]})[0]
            if not same_bits(got, wanted[index]):
                failures.append(index)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# -- the host loop: errors, profiler, outputs ------------------------------------------------

def reshape_model():
    """y = Reshape(x + 1, shape): the shape is a feed, so a bad one fails at run time."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["a"], name="plus"),
         helper.make_node("Reshape", ["a", "shape"], ["r"], name="to_shape"),
         helper.make_node("Relu", ["r"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.float32(1.0), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def test_a_planned_run_that_fails_names_the_node():
    session = Session(reshape_model(), opt_level=0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    good = session.run(None, {"x": x, "shape": np.array([4, 3])})[0]
    np.testing.assert_array_equal(good, (x + 1).reshape(4, 3))
    session.run(None, {"x": x, "shape": np.array([2, 6])})  # planned, same signature
    with pytest.raises(ExecutionError, match="to_shape") as raised:
        session.run(None, {"x": x, "shape": np.array([5, 5])})
    assert "Reshape" in str(raised.value)
    # and the session still serves (the arena went back to its pool)
    np.testing.assert_array_equal(session.run(None, {"x": x, "shape": np.array([6, 2])})[0],
                                  (x + 1).reshape(6, 2))


def test_the_profiler_still_records_every_node(tmp_path):
    path = tmp_path / "trace.json"
    ops = ["Relu", "Sin", "Exp", "Neg", "Relu"]
    session = Session(chain(ops, (2, 5)), opt_level=0, profile=str(path))
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    for _ in range(3):
        session.run(None, {"x": x})
    session.end_profiling()
    kernels = [e for e in json.loads(path.read_text())["traceEvents"]
               if e.get("cat") == "kernel"]
    names = [f"{op.lower()}{i}" for i, op in enumerate(ops)]
    # every run: the first run's discovery, then the planned runs
    assert [e["name"] for e in kernels] == names * 3
    assert all(e["args"]["input_shapes"] == [[2, 5]] for e in kernels)


def test_planned_outputs_own_their_memory_and_keep_the_bits():
    graph = chain(["Relu", "Sin", "Relu"], (3, 4))
    session = Session(graph, opt_level=0)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    first = session.run(None, {"x": x})[0]
    second = session.run(None, {"x": x})[0]
    third = session.run(None, {"x": -x})[0]
    assert first is not second and same_bits(first, second)
    assert not np.shares_memory(second, third)
    np.testing.assert_array_equal(second, np.maximum(np.sin(np.maximum(x, 0)), 0))


def test_only_runs_of_sizable_models_wake_the_native_workers(monkeypatch):
    from mixrt.ops.compiled.worker_wakes import WakeChoice  # noqa: PLC0415
    woken = []  # a run with no plan yet wakes them directly, a planned one by its choice
    monkeypatch.setattr(jit_cpu, "native_run_begins", lambda: woken.append(1))
    monkeypatch.setattr(WakeChoice, "begins", lambda self, *pool: woken.append(1))
    monkeypatch.setattr(jit_cpu, "loaded_native_pool", lambda: "a pool")  # the lane's, kept
    small = Session(chain(["Relu", "Neg"], (1, 16)))
    x = np.ones((1, 16), np.float32)
    for _ in range(3):
        small.run(None, {"x": x})
    assert len(woken) == 1  # the first run (no plan yet) only
    weight = numpy_helper.from_array(np.ones((256, 512), np.float32), "w")  # 512 KiB
    large = Session(model([helper.make_node("MatMul", ["x", "w"], ["y"])], (1, 256),
                          initializers=[weight]))
    woken.clear()
    for _ in range(3):
        large.run(None, {"x": np.ones((1, 256), np.float32)})
    assert len(woken) == 3


def test_runs_that_use_the_native_workers_end_their_count():
    """A run holds the native workers in their longer spin only while it lasts: the first
    (discovery), planned and steady runs each end what they began."""
    weight = numpy_helper.from_array(np.ones((256, 512), np.float32), "w")
    session = Session(model([helper.make_node("MatMul", ["x", "w"], ["y"])], (1, 256),
                            initializers=[weight]))
    for _ in range(4):
        session.run(None, {"x": np.ones((1, 256), np.float32)})
    pool = jit_cpu.native_pool()
    if pool is None:
        pytest.skip("no native pool here (one thread, no AVX-512 or not Linux x86-64)")
    from mixrt.ops.panels._jit_native_pool import RUNS  # noqa: PLC0415  (numba)
    assert pool.block[RUNS] == 0


# -- the session's per-run checks ------------------------------------------------------------

def test_feeds_are_checked_again_whenever_they_change():
    session = Session(chain(["Relu"], ("n", 4)))
    x = np.ones((2, 4), np.float32)
    session.run(None, {"x": x})
    session.run(None, {"x": x})  # the remembered layout
    with pytest.raises(InputError, match="dtype"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(InputError, match="dimension 1"):
        session.run(None, {"x": np.ones((2, 5), np.float32)})
    with pytest.raises(InputError, match="not inputs"):
        session.run(None, {"x": x, "z": x})
    with pytest.raises(InputError, match="missing"):
        session.run(None, {})
    class Tagged(np.ndarray):
        pass

    tagged = np.array([[-1.0, 2.0, -3.0, 4.0]] * 3, np.float32).view(Tagged)
    np.testing.assert_array_equal(session.run(None, {"x": tagged})[0],
                                  [[0.0, 2.0, 0.0, 4.0]] * 3)  # a subclass: checked in full
    # a list takes the input's declared dtype; one of another shape is still checked in full
    np.testing.assert_array_equal(session.run(None, {"x": [[-1.0, 2.0, 3.0, 4.0]]})[0],
                                  [[0.0, 2.0, 3.0, 4.0]])
    with pytest.raises(InputError, match="dimension 1"):
        session.run(None, {"x": [[1.0, 2.0, 3.0]]})
    assert session.run(None, {"x": np.ones((5, 4), np.float32)})[0].shape == (5, 4)
    np.testing.assert_array_equal(session.run(None, {"x": -x})[0], np.zeros((2, 4)))


def test_a_remembered_layout_answers_with_the_same_plan():
    session = Session(chain(["Relu", "Neg"], (2, 3)), opt_level=0)
    x = np.ones((2, 3), np.float32)
    session.run(None, {"x": x})
    session.run(None, {"x": x})
    (plan,) = session._plans.values()
    assert session._last_plan[1] is plan
    assert len(plan.pool) == 1  # one arena, given back after each run


# -- the run gate's background runs ------------------------------------------------------------

def test_a_background_run_does_not_hand_later_runs_to_the_runner():
    gate = BlasGate(enabled=True)
    assert gate.run(lambda: 1) == 1  # the service's thread
    answers = []
    thread = threading.Thread(target=lambda: answers.append(gate.run(lambda: 2, aside=True)))
    thread.start()
    thread.join()
    assert answers == [2] and gate._runner is None
    thread = threading.Thread(target=lambda: answers.append(gate.run(lambda: 3)))
    thread.start()
    thread.join()
    assert answers == [2, 3] and gate._runner is not None  # a second caller still does


def test_the_kernel_tiers_loading_run_is_a_background_run():
    session = Session(chain(["Relu"], (2, 2)))
    session._gate = gate = BlasGate(enabled=True)
    x = np.ones((2, 2), np.float32)
    session.run(None, {"x": x})

    class Tiers:  # the loading run's marker is the session's tiers object
        def compiled(self, signature, feeds):
            return True

        def is_compiled(self, signature):
            return True

    session._tiers = Tiers()
    done = []

    def loading_run():
        token = kernel_tiers._LOADING.set(session._tiers)
        try:
            done.append(session.run(None, {"x": x})[0])
        finally:
            kernel_tiers._LOADING.reset(token)

    thread = threading.Thread(target=loading_run)
    thread.start()
    thread.join()
    assert len(done) == 1 and gate._runner is None


# -- helpers the hot paths use -----------------------------------------------------------------

def test_quiet_numpy_ignores_errors_and_restores_the_state():
    before = np.geterr()
    with np.errstate(divide="raise"):
        with quiet_numpy():
            assert set(np.geterr().values()) == {"ignore"}
            assert np.float32(1) / np.zeros(1, np.float32) == np.inf  # no error raised
            with quiet(np):  # a kernel's own block costs nothing more here
                assert set(np.geterr().values()) == {"ignore"}
            with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
                np.sqrt(-np.ones(1))
        assert np.geterr()["divide"] == "raise"
    assert np.geterr() == before


def test_filled_views_are_kept_per_shape_and_nan_is_not():
    like = np.zeros((3, 5), np.float32)
    zeros = filled(0, like)
    assert zeros is filled(0.0, like) and zeros.shape == (3, 5) and not zeros.flags.writeable
    assert not zeros.any() and zeros.strides[0] == 0
    nan = filled(float("nan"), like)
    assert np.isnan(nan).all() and nan.shape == (3, 5)


def test_pinned_reads_the_thread_count_once_when_first_asked(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "3")
    with parallel.pinned():
        monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "5")  # set before the first ask
        assert parallel.intra_op_threads() == 5
        monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
        assert parallel.intra_op_threads() == 5  # pinned for the block
    assert parallel.intra_op_threads() == 2
