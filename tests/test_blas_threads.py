"""The run gate: concurrent CPU runs take turns (OpenBLAS contends when they overlap), a run
inside a run does not wait for itself, and sessions from many threads stay correct."""

import contextvars
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime.blas_threads import BlasGate


def test_runs_take_turns():
    gate = BlasGate(enabled=True)
    inside, most = [0], [0]
    lock = threading.Lock()

    def one_run():
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.0001)
        with lock:
            inside[0] -= 1

    def worker():
        for _ in range(50):
            gate.run(one_run)
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most[0] == 1 and inside[0] == 0


def _finishes_in_a_thread(body) -> bool:
    """Whether ``body(done)`` sets ``done`` on another thread within 10 s (not stuck)."""
    done = threading.Event()
    thread = threading.Thread(target=body, args=(done,), daemon=True)
    thread.start()
    thread.join(10)
    return done.is_set()


def test_a_run_inside_a_run_on_the_same_thread_does_not_wait_for_itself():
    gate = BlasGate(enabled=True)

    def nested(done):
        gate.run(lambda: gate.run(done.set))
    assert _finishes_in_a_thread(nested)
    assert _finishes_in_a_thread(nested)  # a second thread: both runs on the runner thread


def test_an_exception_inside_a_run_lets_the_next_one_in():
    gate = BlasGate(enabled=True)

    def failing():
        raise ValueError("kernel failed")
    with pytest.raises(ValueError, match="kernel failed"):
        gate.run(failing)

    def next_run(entered):
        with pytest.raises(ValueError, match="kernel failed"):  # raised from the runner thread
            gate.run(failing)
        gate.run(entered.set)
    assert _finishes_in_a_thread(next_run)


def test_a_disabled_gate_lets_runs_overlap():
    gate = BlasGate(enabled=False)
    both = threading.Barrier(2, timeout=10)

    def worker():
        gate.run(both.wait)  # would time out if the second run had to wait for the first
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not both.broken


SCOPE = contextvars.ContextVar("scope", default="none")


def test_runs_from_a_second_thread_are_carried_out_on_one_runner_thread():
    gate = BlasGate(enabled=True)
    ran_on = []

    def body():
        ran_on.append((threading.get_ident(), SCOPE.get(), np.geterr()["divide"]))
        return len(ran_on)
    assert gate.run(body) == 1  # the first caller runs in place
    main = threading.get_ident()

    def from_another_thread(done):
        SCOPE.set("request")
        with np.errstate(divide="ignore"):
            gate.run(body)
            gate.run(body)
        done.set()
    assert _finishes_in_a_thread(from_another_thread)
    assert gate.run(body) == 4  # from now on the first caller's runs are handed over too
    threads = [thread for thread, _, _ in ran_on]
    assert threads[0] == main and len(set(threads[1:])) == 1 and threads[1] != main
    # the caller's context goes with its run: its context variables and NumPy's error state
    assert [scope for _, scope, _ in ran_on] == ["none", "request", "request", "none"]
    assert [divide for _, _, divide in ran_on][1:3] == ["ignore", "ignore"]


def test_a_forked_child_starts_with_its_own_first_caller(monkeypatch):
    """A child forked after its parent ran (``mixrt serve``'s workers) inherits the gate:
    its first thread to run is its first caller, not the parent's, so its one request
    thread runs in place instead of handing each run to a runner thread."""
    from mixrt.runtime import blas_threads  # noqa: PLC0415
    gate = BlasGate(enabled=True)
    ran_on = []

    def body():
        ran_on.append(threading.get_ident())
    gate.run(body)  # the parent's first caller

    def in_the_child(done):
        gate.run(body)
        gate.run(body)
        done.set()
    parent = blas_threads.process_id()
    monkeypatch.setattr(blas_threads, "process_id", lambda: parent + 1)  # as after a fork
    assert _finishes_in_a_thread(in_the_child)
    assert gate._runner is None  # both of the child's runs on its own thread
    assert ran_on[1] == ran_on[2] != ran_on[0]


def test_one_blas_thread_in_the_environment_turns_the_gate_off(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert not BlasGate()._enabled
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert BlasGate()._enabled
    monkeypatch.setenv("MIXRT_RUN_GATE", "0")
    assert not BlasGate()._enabled


def test_sessions_from_many_threads_give_the_serial_results():
    size = 256
    weight = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mm", [x], [y], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model.SerializeToString())
    inputs = [np.full((size, size), k / 16, np.float32) for k in range(8)]
    expected = [session.run(None, {"x": value})[0] for value in inputs]
    failures = []

    def worker(k):
        for _ in range(20):
            if not np.array_equal(session.run(None, {"x": inputs[k]})[0], expected[k]):
                failures.append(k)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
