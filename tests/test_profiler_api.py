"""mixrt.profiler: MXNet's process-wide profiler API over runtime/profiler.py — sessions
(hybridized code) and imperative ops recorded while it runs, pause/resume, scopes, markers,
memory counters, the aggregate table and its argument checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import mixrt  # noqa: F401  (before NumPy: mixrt's BLAS policy)
import numpy as np
import pytest

from mixrt import profiler, sym
from mixrt.errors import InputError
from mixrt.runtime import profiler as runtime_profiler


@pytest.fixture(autouse=True)
def fresh_profiler(tmp_path):
    """Each test starts stopped, with default options and no events, and leaves it so."""
    def reset():
        profiler.set_state("stop")
        profiler.set_config(filename=str(tmp_path / "discarded.json"))
        profiler.dump(finished=True)
    reset()
    yield
    reset()


def two_op_session():
    """Relu then Sigmoid: the intermediate lives in the arena, so runs have arena bytes."""
    x = sym.Variable("x", shape=(2, 3))
    net = sym.Sigmoid(sym.Relu(x, name="relu1"), name="sigmoid1")
    return mixrt.Session(net.to_graph(), opt_level=0)  # unfused: one event per op


def feeds():
    return {"x": np.arange(-3, 3, dtype=np.float32).reshape(2, 3)}


def recorded(path) -> list[dict]:
    return json.loads(path.read_text())["traceEvents"]


def test_session_runs_are_traced_with_memory_counters(tmp_path):
    path = tmp_path / "trace.json"
    session = two_op_session()  # made before the profiler starts: checked per run
    profiler.set_config(filename=str(path))
    profiler.set_state("run")
    session.run(None, feeds())  # the first run of a shape (planning the arena) counts too
    session.run(None, feeds())
    profiler.set_state("stop")
    session.run(None, feeds())  # after stop: not recorded
    assert profiler.dump() == str(path)
    events = recorded(path)
    kernels = [e for e in events if e.get("cat") == "symbolic"]
    assert [e["name"] for e in kernels] == ["relu1", "sigmoid1"] * 2
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in kernels)
    assert kernels[0]["args"] == {"op": "Relu", "input_shapes": [[2, 3]],
                                  "output_shapes": [[2, 3]], "tier": "compiled"}
    runs = [e for e in events if e.get("name") == "run"]
    assert len(runs) == 1 and runs[0]["cat"] == "session"  # the planned run
    counters = [e for e in events if e["ph"] == "C"]
    assert [c["name"] for c in counters] == ["memory:cpu"]
    assert counters[0]["args"]["allocated_bytes"] == runs[0]["args"]["arena_bytes"] > 0


def test_a_session_with_its_own_profiler_keeps_its_trace_to_itself(tmp_path):
    own = tmp_path / "own.json"
    x = sym.Variable("x", shape=(2, 3))
    session = mixrt.Session(sym.Relu(x, name="r").to_graph(), profile=str(own))
    profiler.set_config(filename=str(tmp_path / "process.json"))
    profiler.set_state("run")
    session.run(None, feeds())
    session.run(None, feeds())
    profiler.set_state("stop")
    assert recorded(Path(profiler.dump())) == []
    session.end_profiling()
    own_events = recorded(own)
    # both runs: the first's discovery and the second's planned run
    assert [e["cat"] for e in own_events if e.get("name") == "r"] == ["kernel", "kernel"]
    assert [e["name"] for e in own_events if e["ph"] == "C"] == ["arena_bytes"]


def test_imperative_hook_records_shapes_and_dtypes(tmp_path):
    path = tmp_path / "imperative.json"
    profiler.set_config(filename=str(path))
    assert runtime_profiler.current() is None
    profiler.set_state("run")
    recorder = runtime_profiler.current()
    assert recorder is not None
    a, b = np.ones((2, 2), np.float32), np.ones(2, np.int64)
    started = time.perf_counter()
    recorder.imperative("Add", started, [a, b], a + b)
    recorder.memory("gpu:0", 4096)
    profiler.set_state("stop")
    assert runtime_profiler.current() is None
    add, memory = recorded(Path(profiler.dump()))
    assert (add["name"], add["cat"], add["ph"]) == ("Add", "imperative", "X")
    assert add["args"] == {"input_shapes": [[2, 2], [2]],
                           "input_dtypes": ["float32", "int64"],
                           "output_shapes": [[2, 2]], "output_dtypes": ["float64"]}
    assert memory == {**memory, "name": "memory:gpu:0", "ph": "C",
                      "args": {"allocated_bytes": 4096}}


def test_options_choose_what_is_recorded(tmp_path):
    path = tmp_path / "some.json"
    profiler.set_config(filename=str(path), profile_symbolic=False, profile_imperative=False,
                        profile_memory=False)
    profiler.set_state("run")
    two_op_session().run(None, feeds())
    runtime_profiler.current().imperative("Add", time.perf_counter(), [], [])
    runtime_profiler.current().memory("cpu", 1)
    profiler.Marker("only this").mark()
    profiler.set_state("stop")
    assert [e["name"] for e in recorded(Path(profiler.dump()))] == ["only this"]

    profiler.set_config(filename=str(path), profile_all=True, profile_symbolic=False)
    recorder = runtime_profiler.process_profiler()
    assert recorder.profile_symbolic and recorder.profile_api  # profile_all wins


def test_pause_and_resume_exclude_what_runs_between(tmp_path):
    path = tmp_path / "paused.json"
    session = two_op_session()
    session.run(None, feeds())
    profiler.set_config(filename=str(path))
    profiler.set_state("run")
    profiler.Marker("before").mark()
    profiler.pause()
    assert runtime_profiler.current() is None
    session.run(None, feeds())
    profiler.Marker("while paused").mark()
    profiler.resume()
    profiler.Marker("after").mark()
    profiler.set_state("stop")
    profiler.resume()  # resuming a stopped profiler does not start it
    assert runtime_profiler.current() is None
    events = recorded(Path(profiler.dump()))
    assert [e["name"] for e in events] == ["before", "after"]
    assert all(e["ph"] == "i" and e["s"] == "p" for e in events)


def test_scopes_prefix_event_names(tmp_path):
    profiler.set_config(filename=str(tmp_path / "scoped.json"))
    profiler.set_state("run")
    session = two_op_session()
    with profiler.scope("forward"):
        session.run(None, feeds())
        with profiler.Scope("inner:"):
            profiler.Marker("m").mark(scope="thread")
    profiler.Marker("outside").mark(scope="global")
    profiler.set_state("stop")
    events = recorded(Path(profiler.dump()))
    assert [e["name"] for e in events if e["ph"] != "C"] == [
        "forward:relu1", "forward:sigmoid1", "forward:inner:m", "outside"]
    assert [e["s"] for e in events if e["ph"] == "i"] == ["t", "g"]


def test_dumps_aggregates_per_op_and_resets(tmp_path):
    profiler.set_config(filename=str(tmp_path / "stats.json"), aggregate_stats=True)
    profiler.set_state("run")
    session = two_op_session()
    for _ in range(3):
        session.run(None, feeds())
    profiler.set_state("stop")
    table = profiler.dumps(reset=True)
    rows = {line.split()[1]: line.split() for line in table.splitlines()
            if line.startswith("symbolic")}
    assert set(rows) == {"Relu", "Sigmoid"}
    count, total, low, high, average = rows["Relu"][2:]
    assert count == "3" and float(low) <= float(average) <= float(high)
    assert float(total) == pytest.approx(3 * float(average), abs=1e-2)
    assert "Relu" not in profiler.dumps()  # reset
    assert "(no operator events recorded)" in profiler.dumps()


def test_dump_finished_or_not(tmp_path):
    path = tmp_path / "partial.json"
    profiler.set_config(filename=str(path))
    profiler.set_state("run")
    profiler.Marker("one").mark()
    profiler.dump(finished=False)
    profiler.Marker("two").mark()
    profiler.set_state("stop")
    assert [e["name"] for e in recorded(path)] == ["one"]
    profiler.dump()
    assert [e["name"] for e in recorded(path)] == ["one", "two"]
    profiler.dump()
    assert recorded(path) == []


def test_continuous_dump_writes_at_stop(tmp_path):
    path = tmp_path / "continuous.json"
    profiler.set_config(filename=str(path), continuous_dump=True)
    profiler.set_state("run")
    profiler.Marker("m").mark()
    assert not path.exists()
    profiler.set_state("stop")
    assert [e["name"] for e in recorded(path)] == ["m"]


def test_bad_arguments_are_input_errors():
    with pytest.raises(InputError, match=r"unknown option\(s\) \['profile_gpu'\].*"
                                         r"profile_memory.*aggregate_stats"):
        profiler.set_config(profile_gpu=True)
    with pytest.raises(InputError, match="profile_all must be True or False"):
        profiler.set_config(profile_all="yes")
    with pytest.raises(InputError, match="filename"):
        profiler.set_config(filename="")
    with pytest.raises(InputError, match=r"\['run', 'stop'\].*'start'"):
        profiler.set_state("start")
    with pytest.raises(InputError, match="aggregate_stats=True"):
        profiler.dumps()
    with pytest.raises(InputError, match=r"\['global', 'process', 'thread'\]"):
        profiler.Marker("m").mark(scope="galaxy")
    with pytest.raises(InputError, match="non-empty"):
        profiler.Scope("")
    assert profiler.state() == "stop" and runtime_profiler.current() is None
