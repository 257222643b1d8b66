"""The two kernel tiers of a CPU session (runtime/kernel_tiers.py): NumPy kernels serve at
once while a child process compiles, then the compiled kernels are swapped in.

These run real child processes over real cache folders (each test its own, empty), on a
model whose compiled kernels take seconds, not minutes, to build: a global average pool
and a layer normalization (ops/nn/_jit_row_reductions.py's row_means and layer_norm)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import jit_tier, parallel
from mixrt.runtime import fingerprints, kernel_tiers

# (not jit_cpu.enabled(): that imports numba, which one test checks a NumPy run never does)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="needs numba")

WAIT = 300  # seconds a test waits for a child compile on a busy 2-core CI machine


def pool_norm_model(channels: int = 8, side: int = 6, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    scale = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "bias")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("LayerNormalization", ["flat", "scale", "bias"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "pool_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, channels])],
        [scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def feeds(batch: int = 2, seed: int = 1) -> dict:
    x = np.random.default_rng(seed).standard_normal((batch, 8, 6, 6)).astype(np.float32)
    return {"x": x}


def shape_markers(folder: Path) -> list[Path]:
    """The warm markers of input signatures (not of their forms) under a test's caches."""
    return [path for path in (folder / "mixrt" / "warm").glob("*.json")
            if not path.name.startswith("form-")]


@pytest.fixture
def background(tmp_path, monkeypatch):
    """Background compiles into caches of this test's own (MIXRT_CACHE_DIR, NUMBA_CACHE_DIR)."""
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path / "mixrt"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    fingerprints._stamp.clear()
    return tmp_path


def test_numpy_tier_gives_the_compiled_tiers_results():
    model = pool_norm_model()
    session = mixrt.Session(model)
    with jit_tier.using(False):
        numpy_tier = session.run(None, feeds())[0]
    compiled = session.run(None, feeds())[0]
    np.testing.assert_allclose(numpy_tier, compiled, rtol=1e-5, atol=1e-6)


def test_the_numpy_tier_never_loads_numba():
    """A cold session's first run must not import numba (~0.4 s) or compile anything."""
    script = ("import sys, numpy as np, mixrt\n"
              "from mixrt.ops.compiled import jit_tier\n"
              "from tests.test_kernel_tiers import pool_norm_model, feeds\n"
              "s = mixrt.Session(pool_norm_model())\n"
              "with jit_tier.using(False):\n"
              "    s.run(None, feeds())\n"
              "print('numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, check=True,
                         env=dict(os.environ, MIXRT_COMPILE="foreground"))
    assert out.stdout.strip() == "False", out.stderr


def test_first_run_serves_numpy_then_switches_to_compiled(background):
    session = mixrt.Session(pool_norm_model())
    first = session.run(None, feeds())[0]
    states = list(session._tiers.states().values())
    assert states in (["pending"], ["loading"], ["compiled"])
    if states != ["compiled"]:  # the steady lane (runtime/steady_run.py) waits for it
        assert not session._steady_runs
    assert session.wait_compiled(timeout=WAIT), session._tiers.states()
    # the sizes wait_compiled runs on zeros ran once the first kernels were in, so on the
    # compiled tier (prepared_forms.run_made_up), each with its state
    states = session._tiers.states()
    assert set(states.values()) == {"compiled"} and len(states) > 1, states
    np.testing.assert_allclose(session.run(None, feeds())[0], first, rtol=1e-5, atol=1e-6)
    assert session._steady_runs
    markers = shape_markers(background)
    assert len(markers) == 1 and json.loads(markers[0].read_text())["compiled"]
    # and one for the signature's form (its ranks and dtypes): a new size of it loads
    assert len(list((background / "mixrt" / "warm").glob("form-*.json"))) == 1


def test_a_warm_marker_loads_the_next_process_without_a_child(background):
    first = mixrt.Session(pool_norm_model())
    first.run(None, feeds())
    assert first.wait_compiled(timeout=WAIT)
    # another process, same caches: its first run is compiled already (every kernel loads
    # from the cache) and no child is started
    script = ("import subprocess, numpy as np, mixrt\n"
              "from tests.test_kernel_tiers import pool_norm_model, feeds\n"
              "started, real = [], subprocess.Popen\n"
              "subprocess.Popen = lambda *a, **k: started.append(a) or real(*a, **k)\n"
              "s = mixrt.Session(pool_norm_model(seed=5))\n"  # other weights, same kernels
              "y = s.run(None, feeds())[0]\n"
              "first = list(s._tiers.states().values())\n"  # the loading run imports numba
              f"print(first, s.wait_compiled(timeout={WAIT}), len(started))\n"
              "np.testing.assert_allclose(s.run(None, feeds())[0], y, rtol=1e-5, atol=1e-6)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, check=True, env=dict(os.environ))
    assert out.stdout.strip() == "['compiled'] True 0", out.stderr


def test_a_warm_marker_over_an_emptied_cache_is_dropped_and_the_child_compiles(background):
    first = mixrt.Session(pool_norm_model())
    first.run(None, feeds())
    assert first.wait_compiled(timeout=WAIT)
    (marker,) = shape_markers(background)
    shutil.rmtree(os.environ["NUMBA_CACHE_DIR"])  # numba's entries gone, the marker kept
    # another process: its first run misses a kernel, so it is answered on the NumPy tier,
    # the stale marker goes, and the child compiles again (and writes the marker again)
    script = ("import numpy as np, mixrt\n"
              "from mixrt.runtime import kernel_tiers\n"
              "from tests.test_kernel_tiers import pool_norm_model, feeds\n"
              "s = mixrt.Session(pool_norm_model(seed=5))\n"
              "y = s.run(None, feeds())[0]\n"
              "first = list(s._tiers.states().values())\n"
              f"print(first, s.wait_compiled(timeout={WAIT}), kernel_tiers.compiler().children)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, check=True, env=dict(os.environ))
    assert out.stdout.strip() == "['pending'] True 1", out.stderr
    assert marker.is_file()


def test_the_switch_is_thread_safe(background):
    """8 threads call one session while its compiled tier is swapped in; every answer is
    the serial one (to float rounding: the tiers may round differently)."""
    session = mixrt.Session(pool_norm_model())
    inputs = [feeds(batch=2, seed=s) for s in range(8)]
    with jit_tier.using(False):
        expected = [session.run(None, f)[0] for f in inputs]
    errors: list = []
    stop = threading.Event()

    def serve(index: int) -> None:
        while not stop.is_set():
            got = session.run(None, inputs[index])[0]
            if not np.allclose(got, expected[index], rtol=1e-5, atol=1e-6):
                errors.append((index, float(np.abs(got - expected[index]).max())))

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert session.wait_compiled(timeout=WAIT), session._tiers.states()
        for _ in range(20):  # keep serving a while in the compiled tier
            session.run(None, inputs[0])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:5]


def test_a_failed_compile_keeps_numpy_and_warns(background, monkeypatch):
    monkeypatch.setattr(kernel_tiers, "WORKER_MODULE", "mixrt.no_such_module")
    session = mixrt.Session(pool_norm_model())
    expected = session.run(None, feeds())[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not session.wait_compiled(timeout=WAIT)
    assert list(session._tiers.states().values()) == ["failed"]
    np.testing.assert_array_equal(session.run(None, feeds())[0], expected)
    assert any(issubclass(w.category, kernel_tiers.CompileWarning)
               and "exited with 1" in str(w.message) for w in caught), caught


def test_fingerprint_ignores_weights_but_not_shapes():
    def fingerprint(model):
        return fingerprints.graph_fingerprint(mixrt.Session(model).graph)
    assert fingerprint(pool_norm_model(seed=0)) == fingerprint(pool_norm_model(seed=3))
    assert fingerprint(pool_norm_model(channels=8)) != fingerprint(pool_norm_model(channels=4))


def _warmup(folder: Path) -> subprocess.Popen:
    """``mixrt warmup`` of the pool-norm model in a process of its own."""
    path = folder / "model.onnx"
    if not path.exists():
        path.write_bytes(pool_norm_model())
    return subprocess.Popen([sys.executable, "-m", "mixrt", "warmup", str(path),
                             "--input", f"x={folder / 'x.npy'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ))


def test_two_processes_filling_one_cache_both_succeed(background):
    np.save(background / "x.npy", feeds()["x"])
    children = [_warmup(background) for _ in range(2)]
    outputs = [child.communicate(timeout=WAIT)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert all("compiled the kernels" in out for out in outputs), outputs
    session = mixrt.Session(str(background / "model.onnx"))
    session.run(None, feeds())
    assert session.wait_compiled(timeout=WAIT)
    # (with the sizes wait_compiled ran to load a form's kernels: prepared_forms.py)
    assert set(session._tiers.states().values()) == {"compiled"}


def test_a_damaged_cache_entry_is_rebuilt(background):
    np.save(background / "x.npy", feeds()["x"])
    child = _warmup(background)
    assert child.communicate(timeout=WAIT)[0] and child.returncode == 0
    entries = [p for p in (background / "numba").rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert entries
    for index, path in enumerate(entries):  # truncated, garbage, empty
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2] if index % 3 == 0 else
                         b"not a cache entry" if index % 3 == 1 else b"")
    script = ("import numpy as np, mixrt\n"
              "from mixrt.ops.compiled import jit_tier\n"
              "from tests.test_kernel_tiers import pool_norm_model, feeds\n"
              "s = mixrt.Session(pool_norm_model())\n"
              "s.run(None, feeds())\n"
              f"assert s.wait_compiled(timeout={WAIT})\n"  # its loading run meets them
              "y = s.run(None, feeds())[0]\n"
              "with jit_tier.using(False):\n"
              "    z = s.run(None, feeds())[0]\n"
              "print(sorted(set(s._tiers.states().values())), np.allclose(y, z, 1e-5, 1e-6))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['compiled'] True", out.stderr[-2000:]


def test_the_profiler_shows_each_runs_tier_and_the_switch(background, tmp_path):
    session = mixrt.Session(pool_norm_model(), profile=str(tmp_path / "trace.json"))
    session.run(None, feeds())
    session.run(None, feeds())  # a planned run in the NumPy tier, profiled
    assert session.wait_compiled(timeout=WAIT)
    session.run(None, feeds())
    trace = json.loads(Path(session.end_profiling()).read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tiers = [e["args"]["tier"] for e in events if e.get("cat") == "kernel"]
    assert tiers[0] == "numpy" and tiers[-1] == "compiled"
    assert any(e["name"] == "kernel tier: compiled" and e["ph"] == "i" for e in events)


def string_and_bfloat16_model() -> bytes:
    """Strings (held as Python objects) and bfloat16 in: the feeds an .npy file cannot
    record as they are, which the compiler's child must still receive."""
    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["words"], ["upper"], case_change_action="UPPER"),
         helper.make_node("Cast", ["half"], ["wide"], to=TensorProto.FLOAT),
         helper.make_node("Relu", ["wide"], ["positive"])],
        "strings",
        [helper.make_tensor_value_info("words", TensorProto.STRING, [3]),
         helper.make_tensor_value_info("half", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("upper", TensorProto.STRING, [3]),
         helper.make_tensor_value_info("positive", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def test_string_and_bfloat16_feeds_reach_the_compiler(background):
    import ml_dtypes
    feeds = {"words": np.array(["a", "bc", ""], dtype=object),
             "half": np.array([-1.5, 0, 2, 3.25], dtype=ml_dtypes.bfloat16)}
    session = mixrt.Session(string_and_bfloat16_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed child compile warns (CompileWarning)
        first = session.run(None, feeds)
        assert session.wait_compiled(timeout=WAIT), session._tiers.states()
    assert list(first[0]) == ["A", "BC", ""]
    np.testing.assert_array_equal(session.run(None, feeds)[1], [0, 0, 2, 3.25])


def test_large_feeds_compile_on_demand_without_a_child(background, monkeypatch):
    """Feeds over LARGE_FEEDS are neither copied nor handed to a child: the signature goes
    straight to the compiled tier, which compiles what it needs in this process."""
    monkeypatch.setattr(kernel_tiers, "LARGE_FEEDS", feeds()["x"].nbytes - 1)
    submitted = []
    monkeypatch.setattr(kernel_tiers.compiler(), "submit", submitted.append)
    session = mixrt.Session(pool_norm_model())
    result = session.run(None, feeds())[0]
    assert submitted == [] and list(session._tiers.states().values()) == ["compiled"]
    monkeypatch.setenv("MIXRT_JIT", "0")
    expected = mixrt.Session(pool_norm_model()).run(None, feeds())[0]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


# -- the child's share of the machine ------------------------------------------------------------

needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="confining the child needs two cores or more")


@needs_two_cores
def test_the_child_is_confined_to_one_core_and_told_the_parents_threads(
        background, monkeypatch, tmp_path):
    # a worker that reports what it was given and fails, so its report reaches the warning;
    # it reads its cores at once: it must be confined before it runs, not soon after
    (tmp_path / "report_worker.py").write_text(
        "import os, sys\n"
        "print('cores', sorted(os.sched_getaffinity(0)), 'threads',"
        " os.environ.get('MIXRT_INTRA_OP_THREADS'))\n"
        "sys.exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setattr(kernel_tiers, "WORKER_MODULE", "report_worker")
    monkeypatch.delenv("MIXRT_COMPILE_CORES", raising=False)
    monkeypatch.delenv("MIXRT_INTRA_OP_THREADS", raising=False)
    session = mixrt.Session(pool_norm_model())
    session.run(None, feeds())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not session.wait_compiled(timeout=WAIT)
    last_core = max(os.sched_getaffinity(0))
    threads = parallel.intra_op_threads()
    reports = [str(w.message) for w in caught
               if issubclass(w.category, kernel_tiers.CompileWarning)]
    assert any("exited with 3" in r and f"cores [{last_core}] threads {threads}" in r
               for r in reports), reports


@needs_two_cores
def test_compile_cores_setting(monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("MIXRT_INTRA_OP_THREADS", raising=False)
    monkeypatch.setenv("MIXRT_COMPILE_CORES", "0")
    assert kernel_tiers.child_cores() is None
    monkeypatch.setenv("MIXRT_COMPILE_CORES", str(len(allowed)))
    assert kernel_tiers.child_cores() is None
    assert "MIXRT_INTRA_OP_THREADS" not in kernel_tiers.child_environment(None)
    monkeypatch.setenv("MIXRT_COMPILE_CORES", "1")
    assert kernel_tiers.child_cores() == {allowed[-1]}
    told = kernel_tiers.child_environment({allowed[-1]})["MIXRT_INTRA_OP_THREADS"]
    assert told == str(parallel.intra_op_threads())
    monkeypatch.setenv("MIXRT_COMPILE_CORES", "not a number")  # the default, not a failure
    assert kernel_tiers.child_cores() == {allowed[-1]}
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "7")  # the user's own setting stands
    assert kernel_tiers.child_environment({allowed[-1]})["MIXRT_INTRA_OP_THREADS"] == "7"


def test_the_compile_child_ends_when_its_process_is_killed():
    """A service killed by a signal runs no exit handler: its compile child must not go on
    compiling beside whatever runs next on the machine (compile_worker._die_with_parent)."""
    child_code = ("import os, time\n"
                  "from mixrt.runtime.compile_worker import _die_with_parent\n"
                  "_die_with_parent()\n"
                  "print('ready', flush=True)\n"
                  "time.sleep(60)\n")
    service_code = ("import os, subprocess, sys\n"
                    f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}],\n"
                    "    stdout=subprocess.PIPE, text=True,\n"
                    "    env=dict(os.environ, MIXRT_COMPILE_PARENT=str(os.getpid())))\n"
                    "child.stdout.readline()\n"
                    "print(child.pid, flush=True)\n"
                    "import time; time.sleep(60)\n")
    service = subprocess.Popen([sys.executable, "-c", service_code], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).parent.parent)
    try:
        child = int(service.stdout.readline())
    finally:
        service.kill()
        service.wait()
    for _ in range(40):
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":  # ended, not yet reaped
                    return
        except FileNotFoundError:
            return
        threading.Event().wait(0.05)
    os.kill(child, 9)
    pytest.fail(f"the compile child {child} outlived its killed process by 2 s")


class _Owner:  # a session, as SessionTiers refers to it (weakly)
    pass


def _tiers_without_children(tmp_path, monkeypatch) -> tuple:
    """(SessionTiers of an owner, that owner, the jobs they submit): no child starts."""
    from types import SimpleNamespace  # noqa: PLC0415
    submitted = []
    monkeypatch.setattr(kernel_tiers, "compiler", lambda: SimpleNamespace(
        submit=submitted.append))
    owner = _Owner()
    tiers = kernel_tiers.SessionTiers(owner, None, 1)
    monkeypatch.setattr(tiers, "_marker", lambda *_, **__: tmp_path / "marker.json")
    return tiers, owner, submitted


def test_a_signature_that_missed_only_optional_kernels_compiles_when_it_comes_back(
        tmp_path, monkeypatch):
    """A run whose every miss had a compiled fallback (``jit_tier.optional``: a depthwise
    form for one image size) starts no child the first time its signature is met, and one
    when it comes back; meanwhile its runs keep loading (never the NumPy tier's PENDING).
    A miss without a fallback starts the child at once, as before."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    tiers, _owner, submitted = _tiers_without_children(tmp_path, monkeypatch)
    one, two = ((("x", ((1, 8, 40, 40), "float32")),),
                (("x", ((1, 8, 44, 44), "float32")),))
    fed = {"x": np.zeros((1, 8, 40, 40), np.float32)}
    optional = [jit_tier.OPTIONAL + "mixrt_depthwise_flat for (40, 40)"]
    tiers._missed(one, fed, optional)
    assert submitted == [] and one not in tiers.states()
    tiers._missed(one, fed, optional)  # it came back: compiled when the cores are idle
    assert [(job.signature, job.idle) for job in submitted] == [(one, True)]
    assert one not in tiers.states()
    tiers._missed(one, fed, optional)  # the form's idle child is busy: no second one
    assert len(submitted) == 1
    # a miss without a fallback does not wait behind the idle child
    tiers._missed(two, fed, optional + ["generated kernel (float32,)"])
    assert [(job.signature, job.idle) for job in submitted] == [(one, True), (two, False)]
    assert tiers.states()[two] == kernel_tiers.PENDING
    tiers._missed(one, fed, ["generated kernel (float32,)"])  # the form's child is busy
    assert len(submitted) == 2 and one not in tiers.states()


def test_a_child_a_run_needs_stops_the_idle_one(tmp_path, monkeypatch):
    """Submitting a job without a fallback stops the child compiling optional kernels (it
    would otherwise run only on idle cores, and hold up the queue); the stopped job's form
    is not marked failed, so its signature asks again when it comes back. An idle child
    that failed of itself is not started again for its form (a child a run needs is)."""
    import queue  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415
    tiers, _owner, _ = _tiers_without_children(tmp_path, monkeypatch)
    signature = (("x", ((1, 8, 40, 40), "float32")),)
    idle = kernel_tiers.CompileJob(tiers, signature, {}, tmp_path / "m", idle=True)
    urgent = kernel_tiers.CompileJob(tiers, signature, {}, tmp_path / "m")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    compiler = SimpleNamespace(_current=idle, _child=child, _jobs=queue.SimpleQueue())
    try:
        kernel_tiers.BackgroundCompiler.submit(compiler, urgent)
        assert child.wait(10) != 0 and idle.stopped and compiler._jobs.get_nowait() is urgent
    finally:
        child.kill()
        child.wait()
    starting = kernel_tiers.CompileJob(tiers, signature, {}, tmp_path / "m", idle=True)
    kernel_tiers.BackgroundCompiler.submit(  # its child not started yet: it is not started
        SimpleNamespace(_current=starting, _child=None, _jobs=queue.SimpleQueue()), urgent)
    assert starting.stopped
    form = kernel_tiers.signature_form(signature)
    tiers._idle_forms.add(form)
    tiers._failed(idle, "the compiler process exited with -15")
    assert form not in tiers._idle_forms and form not in tiers._failed_forms
    assert signature not in tiers.states()
    failing = kernel_tiers.CompileJob(tiers, signature, {}, tmp_path / "m", idle=True)
    tiers._idle_forms.add(form)
    tiers._failed(failing, "the compiler process exited with 1")
    assert form in tiers._idle_failed and signature not in tiers.states()
    assert form not in tiers._failed_forms  # a child a run needs still starts for the form
    tiers._compile_when_idle(signature, {})  # but no idle one again
    assert form not in tiers._idle_forms


def test_an_idle_child_waits_for_a_quiet_process_and_a_run_stops_it(tmp_path, monkeypatch):
    """An idle job (optional kernels) starts its child only once no run has begun for
    QUIET_S; a run that begins while it compiles stops it, and the job waits for the next
    quiet time (MobileNetV2's requests 10 ms apart took 19-29 ms beside such a child, 10-11
    without). The child here sleeps, so only a stop ends it."""
    from types import SimpleNamespace  # noqa: PLC0415
    from mixrt.runtime import quiet_time  # noqa: PLC0415
    (tmp_path / "sleeping_worker.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setattr(kernel_tiers, "WORKER_MODULE", "sleeping_worker")
    monkeypatch.setattr(kernel_tiers, "_job_spec", lambda *_: None)
    monkeypatch.setattr(quiet_time, "QUIET_S", 0.5)
    owner = _Owner()
    tiers = SimpleNamespace(_session=lambda: owner, _compiled=lambda job: None,
                            _failed=lambda job, why: None)
    job = kernel_tiers.CompileJob(tiers, (), {}, tmp_path / "never-written.json", idle=True)
    compiler = kernel_tiers.BackgroundCompiler()
    try:
        quiet_time.note_run()
        began = time.monotonic()
        compiler.submit(job)
        _until(lambda: compiler.children == 1)
        assert time.monotonic() - began >= 0.5  # not before the process was quiet
        _until(lambda: compiler._child is not None)
        child = compiler._child
        quiet_time.note_run()  # a run begins: the child stops, the job waits again
        assert child.wait(10) != 0
        _until(lambda: list(compiler._deferred) == [job])
        assert not job.stopped
        _until(lambda: compiler.children == 2)  # the next quiet time
    finally:
        compiler.close()


def _until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_idle_child_runs_at_the_idle_priority():
    """compile_worker's priority: SCHED_IDLE where Linux has it (a core nothing else
    wants), nice 10 for a child a run needs; every thread's, OpenBLAS's too."""
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this system")
    code = ("import os, sys\n"
            "import numpy  # (OpenBLAS starts its threads as it loads)\n"
            "from mixrt.runtime.compile_worker import _lower_priority\n"
            "_lower_priority(sys.argv[1] == 'idle')\n"
            "threads = [int(t) for t in os.listdir('/proc/self/task')]\n"
            "print(all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in threads),\n"
            "      min(os.getpriority(os.PRIO_PROCESS, t) for t in threads), len(threads))\n")
    idle = subprocess.run([sys.executable, "-c", code, "idle"], capture_output=True,
                          text=True, check=True).stdout.split()
    urgent = subprocess.run([sys.executable, "-c", code, "urgent"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert idle[0] == "True" and urgent[0] == "False"
    assert int(urgent[1]) >= 10  # every thread's


def test_feeds_the_model_refuses_start_no_child_and_leave_the_form_compiling(
        tmp_path, monkeypatch):
    """A first run that missed a kernel and then met the model's own error (a length past
    its positions, which a warm-up's made-up sizes may try) raises that error on the NumPy
    tier too, and starts no child: the child failed on those feeds, and the form was marked
    failed with a CompileWarning, so no later size of it had its misses compiled. A run
    whose NumPy tier answers hands its misses to the child as before."""
    tiers, _owner, submitted = _tiers_without_children(tmp_path, monkeypatch)
    refused = (("x", ((1, 604), "int64")),)
    fed = {"x": np.zeros((1, 604), np.int64)}

    def run_refused():
        if jit_tier.compiled_allowed():
            jit_tier.compile_misses().append("generated kernel (float32,)")
        raise ValueError("positions (1, 512) and tokens (1, 604) do not broadcast")

    with pytest.raises(ValueError, match="do not broadcast"):
        tiers.first_run(refused, fed, run_refused)
    assert submitted == [] and refused not in tiers.states()
    assert not tiers._failed_forms and not tiers._compiling

    answered = (("x", ((1, 100), "int64")),)

    def run_answered():
        if jit_tier.compiled_allowed():
            jit_tier.compile_misses().append("generated kernel (float32,)")
            raise jit_tier.CompileForbidden("a step with no NumPy path alone")
        return ["numpy"]

    assert tiers.first_run(answered, {"x": np.zeros((1, 100), np.int64)},
                           run_answered) == ["numpy"]
    assert [job.signature for job in submitted] == [answered]
