"""Worker threads kept off the CPU of the thread that calls a run (base/placement.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from mixrt.base import placement

ROOT = Path(__file__).resolve().parent.parent

# a child's session of one product large enough to split over the workers: ``s``, its feed
# ``x``
SPLIT_PRODUCT = """
import os, numpy as np, mixrt
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((256, 512)).astype(np.float32), "w")
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512])], [w])
model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
s = mixrt.Session(model.SerializeToString())
x = rng.standard_normal((64, 256)).astype(np.float32)
"""

pytestmark = pytest.mark.skipif(not placement.supported() or len(os.sched_getaffinity(0)) < 2,
                                reason="needs Linux's sched_setaffinity and two CPUs")


@pytest.fixture
def idle_worker():
    """A thread that waits until the test ends, adopted as a worker: its id."""
    started, stop = threading.Event(), threading.Event()
    ids = []

    def idle():
        ids.append(threading.get_native_id())
        started.set()
        stop.wait()
    worker = threading.Thread(target=idle, daemon=True)
    worker.start()
    started.wait()
    placement.adopt(ids)
    yield ids[0]
    stop.set()
    worker.join()
    placement._workers.discard(ids[0])


def test_adopted_threads_are_kept_off_the_callers_cpu(monkeypatch, idle_worker):
    """A thread adopted as a worker may run anywhere the process may but where the caller
    is, and is placed again when the caller moves."""
    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus[:2]:
        monkeypatch.setattr(placement, "_getcpu", lambda cpu=cpu: cpu)
        placement.keep_off_caller()
        assert os.sched_getaffinity(idle_worker) == set(cpus) - {cpu}


def test_an_ended_worker_is_forgotten(monkeypatch):
    """A worker whose thread ended (Linux answers ESRCH for its id) is dropped."""
    ended = 1 << 30  # no thread has this id (pid_max is at most 2^22)
    placement.adopt([ended])
    monkeypatch.delenv("MIXRT_PLACE_WORKERS", raising=False)
    monkeypatch.setattr(placement, "_getcpu", lambda: sorted(os.sched_getaffinity(0))[0])
    placement._state["cpu"] = None
    placement.keep_off_caller()
    assert ended not in placement.workers()


def test_a_process_places_openblas_and_the_native_workers():
    """In a fresh process: OpenBLAS's threads (mixrt loads NumPy) and, once a run has used
    them, the native pool's and the intra-op pool's are workers; after a run none of them
    may use the caller's CPU, and the caller itself is not pinned."""
    script = """
import os, threading
import mixrt
import numpy as np
from mixrt.base import placement
from mixrt.ops.compiled import jit_cpu, parallel
allowed = set(os.sched_getaffinity(0))
before = set(placement.workers())
pool = jit_cpu.native_pool()
parallel.parallel_for([(0,), (1,)], lambda i: None)
x = np.ones((2, 4), np.float32)
from onnx import helper, TensorProto
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
mixrt.Session(model.SerializeToString()).run(None, {"x": x})
cpu = placement._state["cpu"]  # where the caller was when the run placed them
workers = placement.workers()
python_workers = {t.native_id for t in threading.enumerate() if t.name.startswith("mixrt-intra")}
print(len(before) >= 1, pool is None or len(workers - before - python_workers) >= 1,
      python_workers <= workers,
      all(cpu not in os.sched_getaffinity(t) for t in workers),
      os.sched_getaffinity(0) == allowed)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, MIXRT_BLAS="auto"), check=True)
    assert out.stdout.split() == ["True"] * 5, out.stdout + out.stderr


def test_placing_can_be_turned_off(monkeypatch, idle_worker):
    monkeypatch.setenv("MIXRT_PLACE_WORKERS", "0")
    monkeypatch.setattr(placement, "_getcpu", lambda: sorted(os.sched_getaffinity(0))[0])
    before = os.sched_getaffinity(idle_worker)
    placement._state["cpu"] = None
    placement.keep_off_caller()
    assert os.sched_getaffinity(idle_worker) == before
    assert placement.placed_off() == -1  # a steady run's start checks no CPU then


def test_runs_answer_the_same_with_workers_placed(tmp_path):
    """Placement moves threads, never results: a product split over the workers gives the
    same bits with the workers placed and not."""
    script = SPLIT_PRODUCT + """
ys = [s.run(None, {"x": x})[0] for _ in range(3)]
np.save(os.environ["OUT"], ys[-1])
"""
    results = []
    for switch in ("1", "0"):
        out = tmp_path / f"placed-{switch}.npy"
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True,
                       env=dict(os.environ, MIXRT_PLACE_WORKERS=switch, OUT=str(out)))
        results.append(np.load(out))
    np.testing.assert_array_equal(results[0], results[1])


def test_the_steady_lane_places_the_workers_again_where_its_caller_moved():
    """A repeated request's lane checks its caller's CPU in the compiled call that starts
    the run (``_jit_native_pool.run_starts``): a caller moved to another CPU has the
    workers placed off that one before they are woken."""
    script = SPLIT_PRODUCT + """
from mixrt.base import placement
from mixrt.ops.compiled import jit_cpu
first, second = sorted(os.sched_getaffinity(0))[:2]
answers = [s.run(None, {"x": x})[0]]  # unpinned: the process's CPUs as placement finds them
for cpu in (first, second, first):
    os.sched_setaffinity(0, {cpu})
    for _ in range(4):
        answers.append(s.run(None, {"x": x})[0])
    lane = bool(s._steady_runs) and any(v.plan.wakes_workers for v in s._steady_runs.values())
    print(lane or jit_cpu.loaded_native_pool() is None, placement._state["cpu"] == cpu,
          all(cpu not in os.sched_getaffinity(t) for t in placement.workers()))
print(all((a == answers[0]).all() for a in answers))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, check=True, env=dict(os.environ, MIXRT_INTRA_OP_THREADS="2"))
    assert out.stdout.split() == ["True"] * 10, out.stdout + out.stderr
