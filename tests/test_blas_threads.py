"""The BLAS gate: concurrent CPU runs take one BLAS thread each, a lone run keeps them all."""

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime.blas_threads import GATE, BlasGate


class RecordingBlas:
    """Stands in for the process's BLAS: records width changes and whether any was made while
    a run was inside the gate (which the gate must never do)."""

    def __init__(self):
        self.calls: list[str] = []
        self.gate = None

    def narrow(self):
        self._record("narrow")

    def widen(self):
        self._record("widen")

    def _record(self, call):
        assert self.gate.running == 0, f"{call} with {self.gate.running} run(s) in flight"
        self.calls.append(call)


def make_gate():
    blas = RecordingBlas()
    gate = BlasGate(blas, enabled=True)
    blas.gate = gate
    return gate, blas


def hold(gate, entered: threading.Event, release: threading.Event):
    with gate.admitted():
        entered.set()
        assert release.wait(10)


def wait_until(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_runs_one_after_another_keep_the_full_width():
    gate, blas = make_gate()
    for _ in range(5):
        with gate.admitted():
            assert not gate.narrow
    assert blas.calls == [] and gate.running == 0


def test_a_second_run_waits_for_idle_then_both_width_changes_happen_with_nothing_in_flight():
    gate, blas = make_gate()
    first_in, first_go = threading.Event(), threading.Event()
    first = threading.Thread(target=hold, args=(gate, first_in, first_go))
    first.start()
    assert first_in.wait(10)

    second_in, second_go = threading.Event(), threading.Event()
    second = threading.Thread(target=hold, args=(gate, second_in, second_go))
    second.start()
    wait_until(lambda: gate.waiting == 1)
    assert not second_in.is_set()  # it may not join a run that uses every BLAS thread

    first_go.set()
    assert second_in.wait(10)
    assert gate.narrow and blas.calls == ["narrow"]

    # while narrow, more runs come straight in
    third_in, third_go = threading.Event(), threading.Event()
    third = threading.Thread(target=hold, args=(gate, third_in, third_go))
    third.start()
    assert third_in.wait(10)
    assert gate.running == 2

    second_go.set()
    third_go.set()
    for thread in (first, second, third):
        thread.join(10)
    assert blas.calls == ["narrow", "widen"]
    assert not gate.narrow and gate.running == 0 and gate.waiting == 0


def test_a_run_inside_a_run_on_the_same_thread_does_not_wait_for_itself():
    gate, blas = make_gate()
    with gate.admitted():
        with gate.admitted():
            assert gate.running == 1
    assert blas.calls == [] and gate.running == 0


def test_an_exception_inside_a_run_still_leaves_the_gate():
    gate, _ = make_gate()
    with pytest.raises(ValueError):
        with gate.admitted():
            raise ValueError("kernel failed")
    assert gate.running == 0
    with gate.admitted():  # and the next run is admitted at once
        pass


def test_many_threads_never_change_the_width_under_a_run():
    gate, blas = make_gate()

    def worker():
        for _ in range(200):
            with gate.admitted():
                time.sleep(0)
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert gate.running == 0 and gate.waiting == 0 and not gate.narrow
    assert blas.calls, "8 threads x 200 runs never overlapped"
    # narrow and widen alternate, starting narrow and ending wide
    assert blas.calls[::2] == ["narrow"] * (len(blas.calls) // 2)
    assert blas.calls[1::2] == ["widen"] * (len(blas.calls) // 2)


def test_a_disabled_gate_changes_nothing():
    blas = RecordingBlas()
    gate = BlasGate(blas, enabled=False)
    blas.gate = gate
    with gate.admitted():
        with gate.admitted():
            pass
    assert blas.calls == [] and gate.running == 0


def _matmul_model(size=256):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])
    weight = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mm", [x], [y], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


def test_real_sessions_from_many_threads_restore_the_blas_width():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    model, weight = _matmul_model()
    session = mixrt.Session(model.SerializeToString())
    before = [info["num_threads"] for info in threadpoolctl.threadpool_info()
              if info["user_api"] == "blas"]
    inputs = [np.full((256, 256), k / 16, np.float32) for k in range(8)]
    expected = [np.maximum(x @ weight, 0) for x in inputs]
    failures = []

    def worker(k):
        for _ in range(20):
            got = session.run(None, {"x": inputs[k]})[0]
            if not np.allclose(got, expected[k], rtol=1e-5, atol=1e-4):
                failures.append(k)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
    assert GATE.running == 0 and not GATE.narrow
    after = [info["num_threads"] for info in threadpoolctl.threadpool_info()
             if info["user_api"] == "blas"]
    assert after == before
