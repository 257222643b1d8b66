"""The dependency engine: same results as the naive engine, write order, parallel reads,
errors at the next wait, no deadlock under many pushing threads, the naive mode."""

import faulthandler
import inspect
import os
import random
import subprocess
import sys
import threading
import time
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixrt.errors import EngineError, InputError
from mixrt.runtime import engine as engine_mod
from mixrt.runtime.engine import Engine, NaiveEngine, engine_kind, get_engine, set_engine

N_VARS = 4
_SHARED = Engine(threads=4)  # hypothesis examples reuse one pool


@pytest.fixture(autouse=True)
def _no_hang(request):
    """A deadlock anywhere in this file ends the run after a minute, printing every thread's
    stack, instead of hanging the suite (a per-example timeout would make hypothesis retry
    the hang while it shrinks)."""
    def abort():
        capture = request.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=False)  # so the stacks reach the terminal
        print(f"\n{request.node.nodeid} hung for 60 s (engine deadlock?)", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)

    watchdog = threading.Timer(60, abort)
    watchdog.daemon = True
    watchdog.start()
    yield
    watchdog.cancel()


@pytest.fixture
def engine():
    eng = Engine(threads=4)
    yield eng
    eng.close()


def _line_above() -> int:
    return inspect.currentframe().f_back.f_lineno - 1


def _this_function() -> str:
    return inspect.currentframe().f_back.f_code.co_name


def _finishes_within(seconds: float, work) -> None:
    """Run ``work`` on a daemon thread; a hang fails the test (with every thread's stack)
    instead of hanging the suite."""
    failure = []

    def body():
        try:
            work()
        except BaseException as exc:
            failure.append(exc)

    runner = threading.Thread(target=body, daemon=True)
    runner.start()
    runner.join(seconds)
    if runner.is_alive():
        faulthandler.dump_traceback(all_threads=True)
        pytest.fail(f"the engine did not finish within {seconds} s (deadlock?)")
    if failure:
        raise failure[0]


# -- same results as the naive engine -------------------------------------------------------

def _step(state, seen, index, reads, writes, pause):
    time.sleep(pause)
    values = [state[r] for r in reads]
    time.sleep(pause)
    seen[index] = values
    for w in writes:
        state[w] = (sum(values) * 31 + index * 7 + w) % 1_000_003


def _run_program(engine, program):
    variables = [engine.new_var(f"v{i}") for i in range(N_VARS)]
    state, seen = {i: i for i in range(N_VARS)}, {}
    for index, (reads, writes, pause, inline) in enumerate(program):
        engine.push(partial(_step, state, seen, index, reads, writes, pause),
                    reads=[variables[i] for i in reads], writes=[variables[i] for i in writes],
                    name=f"op{index}", inline=inline)
    engine.wait_all()
    return state, seen


_var_ids = st.lists(st.integers(0, N_VARS - 1), max_size=2)
_ops = st.tuples(_var_ids, _var_ids, st.sampled_from([0.0, 0.0001, 0.0005]), st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.lists(_ops, min_size=1, max_size=24))
def test_random_programs_end_like_the_naive_engine(program):
    assert _run_program(_SHARED, program) == _run_program(NaiveEngine(), program)


# -- ordering ---------------------------------------------------------------------------------

def test_writes_to_one_var_run_in_push_order(engine):
    var, order = engine.new_var("log"), []
    for i in range(300):
        engine.push(partial(order.append, i), writes=(var,), inline=(i % 7 == 0))
    engine.wait_to_read(var)
    assert order == list(range(300))


def test_reads_of_one_var_run_together_and_a_later_write_waits_for_both():
    engine, log = Engine(threads=2), []
    var = engine.new_var("x")
    barrier = threading.Barrier(2, timeout=5)  # breaks (an error) if the reads are serialized

    def read():
        barrier.wait()
        log.append("read")

    engine.push(read, reads=(var,), name="reader")
    engine.push(read, reads=(var,), name="reader")
    engine.push(partial(log.append, "write"), writes=(var,), name="writer")
    engine.wait_all()
    engine.close()
    assert log == ["read", "read", "write"]


def test_a_write_waits_for_the_reads_pushed_before_it(engine):
    var, state, seen = engine.new_var("x"), {"x": 1}, []

    def slow_read():
        time.sleep(0.05)
        seen.append(state["x"])

    engine.push(slow_read, reads=(var,))
    engine.push(lambda: state.update(x=2), writes=(var,), inline=True)
    assert seen == [1] and state["x"] == 2


def test_a_var_both_read_and_written_or_listed_twice_counts_as_one_write(engine):
    var, state = engine.new_var("x"), {"x": 0}

    def increment():
        value = state["x"]
        time.sleep(0)  # invites a lost update if two increments overlap
        state["x"] = value + 1

    for i in range(200):
        engine.push(increment, reads=(var, var), writes=(var, var), inline=(i % 5 == 0))
    engine.wait_to_read(var)
    assert state["x"] == 200


def test_wait_to_write_waits_for_pending_reads(engine):
    var, done = engine.new_var("x"), []
    engine.push(lambda: (time.sleep(0.05), done.append(1)), reads=(var,))
    engine.wait_to_read(var)  # nothing writes it: returns at once
    engine.wait_to_write(var)
    assert done == [1]


# -- errors -----------------------------------------------------------------------------------

def _boom():
    raise ValueError("bad value")


def test_an_error_surfaces_at_the_wait_naming_op_and_line_then_clears(engine):
    x, y = engine.new_var("x"), engine.new_var("y")
    ran = []
    engine.push(_boom, writes=(x,), name="boom_op")
    line = _line_above()
    engine.push(partial(ran.append, 1), reads=(x,), writes=(y,), name="after")
    with pytest.raises(EngineError) as caught:
        engine.wait_to_read(x)
    error = caught.value
    assert error.op_name == "boom_op" and "boom_op" in str(error)
    assert f"test_engine.py:{line} in test_an_error_surfaces" in str(error)
    assert error.pushed_at.endswith(f"test_engine.py:{line} in {_this_function()}")
    assert isinstance(error.__cause__, ValueError) and "bad value" in str(error)
    with pytest.raises(EngineError) as inherited:
        engine.wait_to_read(y)
    assert inherited.value is error and ran == []
    engine.wait_to_read(x)  # raised once: cleared
    engine.push(partial(ran.append, 2), reads=(x,), writes=(y,))
    engine.wait_to_read(y)
    engine.wait_all()
    assert ran == [2]


def test_a_successful_write_clears_the_error(engine):
    x = engine.new_var("x")
    engine.push(_boom, writes=(x,))
    engine.push(lambda: None, writes=(x,))
    engine.wait_to_read(x)


def test_wait_all_raises_the_oldest_error_once(engine):
    x, y = engine.new_var("x"), engine.new_var("y")
    engine.push(_boom, writes=(x,), name="first")
    engine.drain()
    engine.push(_boom, writes=(y,), name="second")
    with pytest.raises(EngineError, match="first"):
        engine.wait_all()
    engine.wait_to_read(x)  # cleared by wait_all
    with pytest.raises(EngineError, match="second"):
        engine.wait_all()
    engine.wait_all()


def test_inline_errors_propagate_unwrapped_and_failed_inputs_raise_at_the_call(engine):
    x, y = engine.new_var("x"), engine.new_var("y")
    with pytest.raises(ValueError, match="bad value"):
        engine.push(_boom, writes=(x,), inline=True)
    engine.push(_boom, writes=(x,), name="pooled_boom")
    ran = []
    with pytest.raises(EngineError, match="pooled_boom"):
        engine.push(partial(ran.append, 1), reads=(x,), writes=(y,), inline=True)
    assert ran == []
    engine.wait_all()  # raised at the call already


def test_an_error_in_one_op_leaves_unrelated_work_alone(engine):
    x, y, out = engine.new_var("x"), engine.new_var("y"), []
    engine.push(_boom, writes=(x,))
    engine.push(partial(out.append, 1), writes=(y,))
    engine.wait_to_read(y)
    assert out == [1]
    with pytest.raises(EngineError):
        engine.wait_to_write(x)


# -- many threads -----------------------------------------------------------------------------

def test_four_threads_pushing_ten_thousand_ops_finish(engine):
    shared = [engine.new_var(f"s{i}") for i in range(3)]
    counts, expected = [0, 0, 0], [0, 0, 0]
    plans = []
    for seed in range(4):
        rng = random.Random(seed)
        plans.append([(rng.randrange(3), rng.randrange(3)) for _ in range(2500)])
        for _, w in plans[-1]:
            expected[w] += 1

    def bump(w):
        value = counts[w]
        time.sleep(0)  # invites a lost update if two writers of one var overlap
        counts[w] = value + 1

    def pusher(plan):
        own = engine.new_var("own")
        for i, (r, w) in enumerate(plan):
            engine.push(partial(bump, w), reads=(shared[r], own), writes=(shared[w],),
                        inline=(i % 10 == 0))

    def everything():
        threads = [threading.Thread(target=pusher, args=(plan,)) for plan in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        engine.wait_all()

    _finishes_within(60, everything)
    assert counts == expected


# -- the naive engine and the process-wide engine ---------------------------------------------

def test_naive_engine_runs_at_the_push_and_raises_there():
    with engine_kind("naive") as engine:
        assert isinstance(get_engine(), NaiveEngine) and engine is get_engine()
        x, out = engine.new_var("x"), []
        engine.push(partial(out.append, 1), writes=(x,))
        assert out == [1]
        with pytest.raises(EngineError) as caught:
            engine.push(_boom, writes=(x,), name="naive_boom")
        line = _line_above()
        assert "naive_boom" in str(caught.value) and f"test_engine.py:{line}" in str(caught.value)
        assert isinstance(caught.value.__cause__, ValueError)
        with pytest.raises(ValueError):
            engine.push(_boom, writes=(x,), inline=True)
    assert not isinstance(get_engine(), NaiveEngine)


def test_set_engine_returns_the_drained_previous_engine_and_rejects_unknown_kinds():
    with engine_kind("threaded") as engine:
        var, out = engine.new_var("x"), []
        engine.push(lambda: (time.sleep(0.02), out.append(1)), writes=(var,))
        previous = set_engine("naive")
        assert previous is engine and out == [1]
        set_engine(previous)
    with pytest.raises(InputError, match="threaded, naive"):
        set_engine("bogus")


def test_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MIXRT_ENGINE_THREADS", "3")
    assert Engine().threads == 3
    monkeypatch.setenv("MIXRT_ENGINE_THREADS", "zero")
    with pytest.raises(InputError, match="MIXRT_ENGINE_THREADS"):
        Engine()


_SCRIPT = """
import mixrt
from mixrt.errors import EngineError
from mixrt.runtime import engine
eng = engine.get_engine()
print(type(eng).__name__)
def boom():
    raise ValueError("bad")
try:
    eng.push(boom, writes=(eng.new_var(),), name="env_boom")
except EngineError as error:
    print("raised at push:", error)
"""


def _run_script(env_value, tmp_path):
    env = {**os.environ, "MIXRT_ENGINE": env_value}
    return subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_mixrt_engine_naive_in_the_environment(tmp_path):
    result = _run_script("naive", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "NaiveEngine"
    push_line = 1 + next(i for i, text in enumerate(_SCRIPT.splitlines()) if "eng.push" in text)
    assert "env_boom" in lines[1] and f"<string>:{push_line} in <module>" in lines[1]
    bogus = _run_script("bogus", tmp_path)
    assert bogus.returncode != 0 and "valid kinds: threaded, naive" in bogus.stderr


def test_the_module_exposes_new_var():
    var = engine_mod.new_var("w")
    assert var.name == "w" and "w" in repr(var)
