"""The native worker pool under the direct convolutions (ops/panels/_jit_panels.py, its last two
sections): the same bits as the parts run through ``parallel_for``, the
worker really taking parts, its sleep and wake, a second caller while the pool is taken,
concurrent callers, and a forked child that gets a pool of its own."""

import importlib
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.first_use import FirstUseEntry
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.conv.conv_cpu import direct
from helpers import until_the_worker_joins

RNG = np.random.default_rng(5)
pytestmark = pytest.mark.skipif(
    jit_cpu.panel_kernels() is None or not conv_direct_cpu.NATIVE_POOL_PLATFORM,
    reason="the native pool drives the panel tile (AVX-512, numba) on Linux x86-64")

CASES = [  # (C, H, W), (M, kh, kw), strides, pads: each way the driver splits an image
    ((16, 34, 34), (40, 3, 3), (1, 1), (1, 1, 1, 1)),  # tap form, bands of rows
    ((64, 14, 14), (96, 3, 3), (1, 1), (1, 1, 1, 1)),  # tap form, panels on shared planes
    ((48, 15, 15), (64, 3, 3), (2, 2), (1, 1, 1, 1)),  # four stride phases, shared
    ((96, 14, 14), (72, 1, 1), (2, 2), (0, 0, 0, 0)),  # strided 1x1: strips, shared
    ((32, 40, 40), (48, 1, 1), (1, 1), (0, 0, 0, 0)),  # 1x1 read in place, bands of rows
    ((64, 30, 30), (80, 1, 1), (1, 1), (0, 0, 0, 0)),  # 1x1 in place, strips of channels
]


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.delenv("MIXRT_NATIVE_POOL", raising=False)
    found = conv_direct_cpu._native_pool()
    assert found is not None and found.workers == 1
    return found


def _conv(X, W, B, Z, kernel, strides, pads, prepacked=None):
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1,
                  "kernel_shape": list(kernel), "pads": list(pads), "strides": list(strides)}
    out = direct(X, W, B, Z, conv_direct_cpu.activation_limits("Relu", ()), attributes, None,
                 {} if prepacked is None else prepacked)
    assert out is not None, "the direct path did not take this convolution"
    return out


def _operands(image, kernel, strides, pads, dtype, batch=2):
    c, h, w = image
    m, kh, kw = kernel
    X = RNG.standard_normal((batch, c, h, w)).astype(dtype)
    W = (RNG.standard_normal((m, c, kh, kw)) * 0.1).astype(dtype)
    B = RNG.standard_normal(m).astype(dtype)
    oh = (h + pads[0] + pads[2] - kh) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - kw) // strides[1] + 1
    Z = RNG.standard_normal((batch, m, oh, ow)).astype(dtype)
    return X, W, B, Z, (kh, kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, kernel, strides, pads", CASES)
def test_the_native_split_gives_the_bits_parallel_for_gives(pool, monkeypatch, image, kernel,
                                                           strides, pads, dtype):
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, dtype)
    native = _conv(X, W, B, Z, kernel_shape, strides, pads)
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")
    assert conv_direct_cpu._native_pool() is None
    threads = _conv(X, W, B, Z, kernel_shape, strides, pads)
    np.testing.assert_array_equal(native, threads)


def test_the_worker_takes_part_in_back_to_back_jobs(pool):
    X, W, B, Z, kernel = _operands(*CASES[0][:1], CASES[0][1], (1, 1), (1, 1, 1, 1), np.float32)
    prepacked: dict = {}
    until_the_worker_joins(pool.block, _native_pool().JOINED,
                           lambda: _conv(X, W, B, Z, kernel, (1, 1), (1, 1, 1, 1), prepacked))


def test_a_sleeping_worker_is_woken_by_the_next_job(pool):
    image, kernel, strides, pads = CASES[1]
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, np.float32)
    expected = _conv(X, W, B, Z, kernel_shape, strides, pads)
    native = _native_pool()
    deadline = time.monotonic() + 5
    while pool.block[native.SLEEPERS] == 0:  # past its spin, the worker sleeps on the futex
        assert time.monotonic() < deadline, "the idle worker never went to sleep"
        time.sleep(0.001)
    joined = pool.block[native.JOINED]
    np.testing.assert_array_equal(_conv(X, W, B, Z, kernel_shape, strides, pads), expected)
    deadline = time.monotonic() + 5
    while pool.block[native.JOINED] == joined:  # woken, it joins a job soon after
        assert time.monotonic() < deadline, "the sleeping worker was never woken"
        _conv(X, W, B, Z, kernel_shape, strides, pads)


def test_a_run_wakes_the_sleeping_worker_and_is_counted_until_it_ends(pool):
    from mixrt.ops.panels import _jit_native_pool as native  # noqa: PLC0415  (numba)
    deadline = time.monotonic() + 10
    while pool.block[native.SLEEPERS] == 0:
        assert time.monotonic() < deadline, "the idle worker never went to sleep"
        time.sleep(0.001)
    runs, wakes = pool.block[native.RUNS], pool.block[native.WAKE:native.WAKE + 1].view(
        np.int32)[0]
    pool.run_begins()
    try:  # counted (the worker spins RUN_SPIN_ROUNDS now), and the futex word bumped
        assert pool.block[native.RUNS] == runs + 1
        assert pool.block[native.WAKE:native.WAKE + 1].view(np.int32)[0] == wakes + 1
    finally:
        pool.run_ends()
    assert pool.block[native.RUNS] == runs
    while pool.block[native.SLEEPERS] == 0:  # with no run left it sleeps again
        assert time.monotonic() < deadline, "the worker never slept after the run"
        time.sleep(0.001)


def test_the_spins_are_counted_in_this_cpus_pauses(pool):
    from mixrt.ops.panels import _jit_native_pool as native  # noqa: PLC0415  (numba)
    rate = native.pauses_per_second()
    idle, in_run = pool.block[native.SPINS], pool.block[native.SPINS + 1]
    # the pool measured its own rate: within 3x of this one, whatever a pause costs here
    assert native.SPIN_SECONDS * rate / 3 < idle < native.SPIN_SECONDS * rate * 3
    assert in_run == pytest.approx(idle * native.RUN_SPIN_SECONDS / native.SPIN_SECONDS,
                                   rel=0.01)


def test_a_worker_spins_on_after_a_run_ends_rather_than_sleeping_at_once(pool):
    """A run ends long after the worker's last job (past the idle spin, within the run's):
    the worker counts its idle spin again from the run's end, for the next run to find it
    awake. The spins are stretched to 0.3 s idle and 30 s in a run (the worker reads them
    from the block as it spins), so that a loaded machine cannot blur the windows."""
    from mixrt.ops.panels import _jit_native_pool as native  # noqa: PLC0415  (numba)
    rate, kept = native.pauses_per_second(), pool.block[native.SPINS:native.SPINS + 2].copy()
    deadline = time.monotonic() + 20
    try:
        pool.block[native.SPINS:native.SPINS + 2] = int(0.3 * rate), int(30 * rate)
        while pool.block[native.SLEEPERS] == 0:
            assert time.monotonic() < deadline, "the idle worker never went to sleep"
            time.sleep(0.001)
        pool.run_begins()  # wakes it: it spins on with no job
        try:
            while pool.block[native.SLEEPERS] != 0:
                assert time.monotonic() < deadline, "the sleeping worker was never woken"
                time.sleep(0.001)
            time.sleep(0.6)  # past the idle spin: without a run it would be asleep by now
        finally:
            pool.run_ends()
        time.sleep(0.05)
        assert pool.block[native.SLEEPERS] == 0, "the worker slept as the run ended"
        while pool.block[native.SLEEPERS] == 0:  # and sleeps once the idle spin is over
            assert time.monotonic() < deadline, "the worker never slept after the run"
            time.sleep(0.001)
    finally:
        pool.block[native.SPINS:native.SPINS + 2] = kept


def test_a_caller_finding_the_pool_taken_runs_every_part_itself(pool):
    image, kernel, strides, pads = CASES[4]
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, np.float64)
    expected = _conv(X, W, B, Z, kernel_shape, strides, pads)
    native = _native_pool()
    pool.block[native.BUSY] = 1  # as if another thread's job held it
    try:
        joined = pool.block[native.JOINED]
        np.testing.assert_array_equal(_conv(X, W, B, Z, kernel_shape, strides, pads), expected)
        assert pool.block[native.JOINED] == joined
        assert pool.block[native.BUSY] == 1
    finally:
        pool.block[native.BUSY] = 0


def test_a_job_whose_entry_is_not_in_the_table_is_taken_whole_by_its_caller(pool,
                                                                            monkeypatch):
    image, kernel, strides, pads = CASES[1]
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, np.float32)
    expected = _conv(X, W, B, Z, kernel_shape, strides, pads)
    jobs = _jobs()
    slot = 2 * jobs.CONV_JOB
    assert jobs.JOB_TABLE[slot] != 0
    entry = jobs.JOB_TABLE[slot]
    # as if no driver had asked job_ready for it
    monkeypatch.setattr(_native_pool(), "job_ready", lambda job, itemsize: None)
    jobs.JOB_TABLE[slot] = 0
    try:
        for _ in range(20):  # the worker joins these jobs and leaves each to the caller
            np.testing.assert_array_equal(_conv(X, W, B, Z, kernel_shape, strides, pads),
                                          expected)
    finally:
        jobs.JOB_TABLE[slot] = entry


def test_a_jobs_entry_is_compiled_for_the_dtype_its_driver_is_set_up_for(pool):
    jobs = _jobs()
    float32_entry, _ = jobs._JOB_ENTRIES[jobs.CONV_JOB]
    assert isinstance(float32_entry, FirstUseEntry)
    image, kernel, strides, pads = CASES[1]
    _conv(*_operands(image, kernel, strides, pads, np.float32)[:4], (3, 3), strides, pads)
    assert jobs.JOB_TABLE[2 * jobs.CONV_JOB] == float32_entry.address


def _jobs():
    """The pool's job table and the entries registered for it."""
    return importlib.import_module("mixrt.ops.panels._jit_native_pool")


def test_concurrent_callers_each_get_their_own_result(pool):
    cases = [_operands(image, kernel, strides, pads, np.float32) + (strides, pads)
             for image, kernel, strides, pads in CASES]
    expected = [_conv(X, W, B, Z, k, s, p) for X, W, B, Z, k, s, p in cases]
    failures: list = []

    def run(index):
        X, W, B, Z, k, s, p = cases[index]
        prepacked: dict = {}
        for _ in range(15):
            if not np.array_equal(_conv(X, W, B, Z, k, s, p, prepacked), expected[index]):
                failures.append(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a caller hung"
    assert failures == []


def _child(queue):
    image, kernel, strides, pads = CASES[0]
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, np.float32)
    first = _conv(X, W, B, Z, kernel_shape, strides, pads)
    os.environ["MIXRT_NATIVE_POOL"] = "0"
    reference = _conv(X, W, B, Z, kernel_shape, strides, pads)
    os.environ["MIXRT_NATIVE_POOL"] = "1"
    queue.put((bool(np.array_equal(first, reference)), id(conv_direct_cpu._native_pool())))


def test_a_forked_child_starts_its_own_worker(pool):
    image, kernel, strides, pads = CASES[0]
    _conv(*_operands(image, kernel, strides, pads, np.float32)[:5], strides, pads)  # in use
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    try:
        same, _ = queue.get(timeout=120)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert same


def test_one_thread_means_no_pool(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")
    assert conv_direct_cpu._native_pool() is None
    image, kernel, strides, pads = CASES[0]
    X, W, B, Z, kernel_shape = _operands(image, kernel, strides, pads, np.float32)
    single = _conv(X, W, B, Z, kernel_shape, strides, pads)
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    # one band of rows instead of two: the tiles fall differently, and a last partial tile
    # adds its bias after the sums rather than before (a rounding apart)
    np.testing.assert_allclose(_conv(X, W, B, Z, kernel_shape, strides, pads), single,
                               rtol=1e-5, atol=1e-5)


def _native_pool():
    return jit_cpu.panel_kernels()


# -- any kernel's parts through a function pointer (CALL_JOB) ---------------------------------

def _marking_part():
    """A PART_SIGNATURE cfunc: part p writes p + 1 over its run of ``out``."""
    from numba import carray, cfunc  # noqa: PLC0415

    @cfunc(_native_pool().PART_SIGNATURE, nopython=True)
    def part(args, index):
        sizes = carray(args[0], (2,), np.int64)
        out = carray(args[1], (sizes[0],), np.float64)
        for i in range(index * sizes[1], min(sizes[0], (index + 1) * sizes[1])):
            out[i] = index + 1
    return part


def _call_parts(pool, part, parts=6, step=7):
    out = np.zeros(parts * step)
    sizes = np.array([out.size, step], np.int64)
    args = np.array([sizes.ctypes.data, out.ctypes.data], np.uint64)
    _native_pool().native_for(pool.block, part.address, args, parts)
    return out


def test_a_call_job_runs_every_part_once_on_both_threads(pool):
    part = _marking_part()
    expected = np.repeat(np.arange(1.0, 7.0), 7)
    for _ in range(40):
        np.testing.assert_array_equal(_call_parts(pool, part), expected)
    until_the_worker_joins(pool.block, _native_pool().JOINED, lambda: np.testing.assert_array_equal(
        _call_parts(pool, part), expected))


def test_a_call_job_finding_the_pool_taken_runs_here(pool):
    native, part = _native_pool(), _marking_part()
    pool.block[native.BUSY] = 1
    try:
        joined = pool.block[native.JOINED]
        np.testing.assert_array_equal(_call_parts(pool, part), np.repeat(np.arange(1.0, 7.0), 7))
        assert pool.block[native.JOINED] == joined
    finally:
        pool.block[native.BUSY] = 0


def test_a_run_alone_leaves_the_sleeping_worker_asleep_and_takes_every_part(pool):
    """A run that found the worker asleep and runs alone (ops/compiled/worker_wakes.py): its
    jobs' parts are all its caller's, the worker neither woken nor joining, the result
    whole; once the run ends, a job wakes the worker again."""
    from mixrt.ops.panels import _jit_native_pool as native  # noqa: PLC0415  (numba)
    part, expected = _marking_part(), np.repeat(np.arange(1.0, 7.0), 7)
    deadline = time.monotonic() + 10
    while not pool.asleep():
        assert time.monotonic() < deadline, "the idle worker never went to sleep"
        time.sleep(0.001)
    joined = pool.block[native.JOINED]
    wakes = pool.block[native.WAKE:native.WAKE + 1].view(np.int32)[0]
    pool.alone_begins()
    try:
        for _ in range(20):
            np.testing.assert_array_equal(_call_parts(pool, part), expected)
        assert pool.block[native.JOINED] == joined
        assert pool.block[native.WAKE:native.WAKE + 1].view(np.int32)[0] == wakes
    finally:
        pool.alone_ends()
    assert pool.block[native.ALONE] == 0
    until_the_worker_joins(pool.block, native.JOINED, lambda: np.testing.assert_array_equal(
        _call_parts(pool, part), expected))


def test_a_planned_runs_start_is_one_call_that_says_what_it_did(pool):
    """``run_starts`` (a steady run's start, ops/compiled/worker_wakes.py): the caller's CPU
    checked against the one the workers were kept off, nothing started where it differs;
    else the run counted as run_begins or alone_begins counts it, by what it found."""
    from mixrt.ops.panels import _jit_native_pool as native  # noqa: PLC0415  (numba)
    here = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(here)})  # the caller stays on one CPU for the checks
    try:
        cpu = min(here)
        runs, alone = pool.block[native.RUNS], pool.block[native.ALONE]
        assert pool.run_starts(True, cpu + 1) == native.CALLER_MOVED
        assert pool.run_starts(True, -2) == native.CALLER_MOVED  # never placed
        assert (pool.block[native.RUNS], pool.block[native.ALONE]) == (runs, alone)
        deadline = time.monotonic() + 10
        while not pool.asleep():
            assert time.monotonic() < deadline, "the idle worker never went to sleep"
            time.sleep(0.001)
        assert pool.run_starts(False, cpu) == native.LEFT_ASLEEP
        assert pool.block[native.ALONE] == alone + 1 and pool.asleep()
        pool.alone_ends()
        wakes = pool.block[native.WAKE:native.WAKE + 1].view(np.int32)[0]
        assert pool.run_starts(True, native.NO_CPU_CHECK) == native.WOKEN
        assert pool.block[native.RUNS] == runs + 1
        assert pool.block[native.WAKE:native.WAKE + 1].view(np.int32)[0] == wakes + 1
        pool.run_ends()
        # a worker awake (one more worker than sleep): the run uses it, whatever it would
        # have done with them all asleep
        assert native.run_starts(pool.block, pool.block[native.SLEEPERS] + 1, False,
                                 cpu) == native.FOUND_AWAKE
        assert pool.block[native.RUNS] == runs + 1
        pool.run_ends()
        assert pool.block[native.RUNS] == runs
    finally:
        os.sched_setaffinity(0, here)


def _one_node_model(op: str, x_shape, weights: dict, **attributes):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    node = helper.make_node(op, ["x", *weights], ["y"], **attributes)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in weights.items()])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


EMPTY_CASES = [  # (op, weights, attributes, a size that splits, an empty size, its output)
    ("Conv", {"W": (64, 16, 3, 3)}, {"pads": [1, 1, 1, 1]}, (1, 16, 64, 48), (1, 16, 64, 0),
     (1, 64, 64, 0)),
    ("Conv", {"W": (64, 16, 3, 3)}, {"pads": [1, 1, 1, 1]}, (1, 16, 64, 48), (1, 16, 0, 48),
     (1, 64, 0, 48)),
    ("Conv", {"W": (96, 64, 1, 1)}, {}, (1, 64, 40, 40), (1, 64, 40, 0), (1, 96, 40, 0)),
    ("Conv", {"W": (64, 16, 3, 3)}, {"strides": [2, 2], "pads": [1, 1, 1, 1]},
     (2, 16, 64, 48), (2, 16, 0, 48), (2, 64, 0, 24)),
    ("MatMul", {"W": (256, 256)}, {}, (512, 256), (0, 256), (0, 256)),
    ("MaxPool", {}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     (1, 64, 95, 79), (0, 64, 95, 79), (0, 64, 48, 40)),
    ("MaxPool", {}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     (1, 64, 95, 79), (1, 64, 95, 0), (1, 64, 48, 0)),
]


@pytest.mark.parametrize("op,weights,attributes,splits,empty,expected", EMPTY_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[4]))}" for c in EMPTY_CASES])
def test_an_empty_size_leaves_the_pool_free_for_the_next_run(pool, tmp_path, op, weights,
                                                              attributes, splits, empty,
                                                              expected):
    """A run at a size with an empty axis (a ladder of made-up sizes reaches them: a
    SqueezeNet whose input is a few pixels wide has a zero-width map) gives its empty
    output (onnxruntime refuses an empty spatial axis; the shape is the operator's formula),
    and the pool is free after it: a kernel that failed between taking the pool and
    finishing its job left it taken, and every later split kernel of the process ran on its
    caller alone (2026-11-29: SqueezeNet at 384x320 took 17 ms on two threads as on one)."""
    import mixrt
    path = tmp_path / "model.onnx"
    model = _one_node_model(op, ["a", "b", "c", "d"][:len(splits)],
                            {name: RNG.standard_normal(shape).astype(np.float32)
                             for name, shape in weights.items()}, **attributes)
    path.write_bytes(model.SerializeToString())
    session = mixrt.Session(str(path))
    big = {"x": RNG.standard_normal(splits).astype(np.float32)}
    session.run(None, big)
    native = _native_pool()
    assert session.run(None, {"x": np.zeros(empty, np.float32)})[0].shape == expected
    assert pool.block[native.BUSY] == 0, "the empty size's kernel left the pool taken"
    until_the_worker_joins(pool.block, native.JOINED, lambda: session.run(None, big))


def test_a_job_its_thread_left_is_closed_and_the_pool_freed(pool):
    """A driver that raises between taking the pool and finishing leaves it taken (compiled
    code has no ``finally``); its thread frees it after the error, and the worker takes
    part in the next job."""
    native = _native_pool()
    assert native.begin(pool.block) >= 0  # a job begun here and never finished
    assert pool.block[native.BUSY] == 1
    assert pool.release_abandoned()
    assert pool.block[native.BUSY] == 0
    assert not pool.release_abandoned()  # nothing left to free
    X, W, B, Z, kernel = _operands(*CASES[0][:1], CASES[0][1], (1, 1), (1, 1, 1, 1), np.float32)
    until_the_worker_joins(pool.block, native.JOINED,
                           lambda: _conv(X, W, B, Z, kernel, (1, 1), (1, 1, 1, 1)))


def test_another_threads_job_in_progress_is_not_freed(pool):
    native = _native_pool()
    taken, release = threading.Event(), threading.Event()

    def holder():
        native.begin(pool.block)
        taken.set()
        release.wait(10)
        native.finish(pool.block)
    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(10)
        assert not pool.release_abandoned()  # this thread's error does not end that job
        assert pool.block[native.BUSY] == 1
    finally:
        release.set()
        thread.join(10)
    assert pool.block[native.BUSY] == 0


def test_a_run_whose_kernel_raised_with_the_pool_taken_frees_it(pool, tmp_path, monkeypatch):
    """The run loop's error path frees a pool its thread's failed kernel left taken: the
    session raises a typed error, and the next run's kernels split again."""
    import mixrt
    from mixrt.errors import ExecutionError
    path = tmp_path / "model.onnx"
    model = _one_node_model("Conv", ["a", "b", "c", "d"],
                            {"W": RNG.standard_normal((64, 16, 3, 3)).astype(np.float32)},
                            pads=[1, 1, 1, 1])
    path.write_bytes(model.SerializeToString())
    session = mixrt.Session(str(path))
    feeds = {"x": RNG.standard_normal((1, 16, 64, 48)).astype(np.float32)}
    expected = session.run(None, feeds)[0]
    native = _native_pool()
    working = conv_direct_cpu.conv

    def fails_holding_the_pool(*args, **kwargs):
        native.begin(pool.block)
        raise ZeroDivisionError("integer division by zero")
    monkeypatch.setattr(conv_direct_cpu, "conv", fails_holding_the_pool)
    other = {"x": RNG.standard_normal((1, 16, 40, 40)).astype(np.float32)}
    with pytest.raises(ExecutionError, match="ZeroDivisionError"):
        session.run(None, other)
    assert pool.block[native.BUSY] == 0
    monkeypatch.setattr(conv_direct_cpu, "conv", working)
    np.testing.assert_array_equal(session.run(None, feeds)[0], expected)
    until_the_worker_joins(pool.block, native.JOINED, lambda: session.run(None, feeds))


def _typed_apart(shape) -> tuple:
    """Arrays whose tuple type no warm-up compiles the address fill for: read-only, of
    three and five dimensions, int16 among them."""
    arrays = (np.arange(6, dtype=np.int16).reshape(1, 2, 3), np.zeros(shape, np.float64),
              np.ones((1, 1, 1, 2, 2), np.float32))
    arrays[0].flags.writeable = arrays[2].flags.writeable = False
    return arrays


def test_the_address_fill_answers_where_compiling_is_refused():
    """A run that may not compile (a loading run) meeting a tuple of array types the
    compiled address fill has no specialisation for gets the addresses read one by one and
    leaves no miss: the step ran NumPy's convolution instead, the run counted a missing
    kernel and each new size of a MobileNetV3 started a compile child."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    from mixrt.ops.panels import native_parts  # noqa: PLC0415
    arrays = _typed_apart((3, 1, 2, 2, 1, 1))  # (never compiled: a cache would keep it)
    with jit_tier.loading_only() as misses:
        out = np.zeros(3, np.uint64)
        native_parts.fill_addresses(out, arrays)
    assert misses == [] and list(out) == _addresses_of(arrays)


def _addresses_of(arrays) -> list:
    return [array.__array_interface__["data"][0] for array in arrays]


def test_a_prepared_calls_read_only_arrays_take_the_writeable_specialisation(monkeypatch):
    """A prepared call's read-only arrays (a node's constant bias) stand in as writeable
    ones in the address fill's tuple, their addresses read apart: one specialisation
    serves both, where numba typed them apart and the read-only one was compiled by no
    warm-up (a 1x1 convolution's bands, taken at large batches only)."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    from mixrt.ops.panels import native_parts  # noqa: PLC0415
    native_parts.warm_prepared((np.zeros((2, 2, 2), np.float32), np.zeros((1, 3))))
    known = len(native_parts._addresses.signatures)
    bias = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    bias.flags.writeable = False
    arrays = (np.zeros(2, np.int64), bias, np.ones((4, 2)))

    def read_one_by_one():
        raise AssertionError("the fill had no specialisation for these arrays")

    monkeypatch.setattr(native_parts, "_forget_own_miss", read_one_by_one)
    with jit_tier.loading_only() as misses:
        out = np.zeros(3, np.uint64)
        native_parts._typed_addresses(out, arrays)
    assert misses == [] and list(out) == _addresses_of(arrays)
    assert len(native_parts._addresses.signatures) == known  # nothing loaded or compiled
