"""A form's shape programs made while ``Session.wait_compiled`` waits
(runtime/prepared_forms.py): a service's first new sizes are planned by arithmetic, with
the answers onnxruntime gives; the programs are made from shapes, then the session runs
once at the first sizes of each set of guards, on zeros, to load their kernels."""

from __future__ import annotations

import types

import numpy as np
import onnxruntime
import pytest

import mixrt
from mixrt.runtime import prepared_forms
from mixrt.runtime.feeds import feed_signature, signature_form
from test_inferred_plans import attention_feeds, attention_model
from test_shape_programs import (concrete_inferences,  # noqa: F401  (a fixture)
                                 positions_feeds, positions_model)


@pytest.mark.parametrize("model, feeds", [(attention_model, attention_feeds),
                                          (positions_model, positions_feeds)])
def test_after_wait_compiled_new_sizes_run_no_concrete_inference(model, feeds, monkeypatch,
                                                                 concrete_inferences):
    data = model()
    session = mixrt.Session(data)
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    session.run(None, feeds(2, 9))
    # the sizes, not the wait's budget: with the suite's other worker busy, the length's
    # doublings took the whole 0.5 s and the batch's never ran (2026-12-05); nor the
    # longest run expected, which the batch's first size, 64 times the ran one's feeds,
    # passed where the ran size took over 0.8 ms under that load (2026-12-05)
    monkeypatch.setattr(prepared_forms, "REACH_BUDGET_S", 10.0)
    monkeypatch.setattr(prepared_forms, "REACH_RUN_MAX_S", 1.0)
    runs = []
    real_run = session.run
    with monkeypatch.context() as patched:
        patched.setattr(session, "run", lambda names, fed: runs.append(fed) or
                        real_run(names, fed))
        session.wait_compiled(600)
    # once at the first sizes of each set of guards (both axes one larger; a batch of
    # one; a length of one), then at sizes spread from the ran one (both axes halved and
    # quartered, each doubled, each four and eight times: these feeds are small), on zeros
    ran = {fed["x"].shape[:2] for fed in runs}
    spread = {(1, 4), (1, 2), (4, 9), (2, 18), (8, 9), (2, 36), (16, 9), (2, 72)}
    # then the reach: the batch from 128, the length from sixteen times its own, doubling
    # while the feeds stay small and the wait's budget lasts, each run twice, let go
    reach = {shape for shape in ran if shape[0] >= 128 or shape[1] >= 144}
    assert all(not value.any() for fed in runs for value in fed.values())
    assert spread <= ran and (128, 9) in reach
    assert ran - spread - reach <= {(3, 10), (1, 10), (3, 1), (2, 9)}
    kept = {dict(key)["x"][0][:2] for key in session._plans._items}
    assert not kept & reach
    (form,) = session._trusted_forms.values()
    assert form.prepared[0] and form.programs and all(p.confirmed for p in form.programs)
    prepared = len(concrete_inferences)
    assert prepared >= 2
    # lengths and batches the session never ran, a batch of one among them
    for batch, length in ((2, 13), (1, 21), (3, 5), (1, 40), (4, 17)):
        fed = feeds(batch, length)
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-4, atol=1e-5)
    assert len(concrete_inferences) == prepared  # each planned by a prepared program


def test_a_form_is_prepared_once(concrete_inferences):
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(2, 9))
    session.wait_compiled(600)
    once = len(concrete_inferences)
    session.wait_compiled(600)
    assert len(concrete_inferences) == once


def test_sizes_past_what_the_model_takes_are_tried_smaller(monkeypatch):
    """Positions past the table (the discovered length at the model's largest) refuse the
    larger sizes; the smaller ones give the program."""
    data = positions_model()
    session = mixrt.Session(data)
    table = 64  # positions_model's table rows
    session.run(None, positions_feeds(2, table))
    session.wait_compiled(600)
    (form,) = session._trusted_forms.values()
    assert form.programs and form.programs[0].confirmed
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    fed = positions_feeds(2, 50)
    np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                               rtol=1e-4, atol=1e-5)


def test_spread_sizes_halve_and_quarter_every_free_axis_then_double_each(monkeypatch):
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(8, 12))
    (form,) = session._trusted_forms.values()
    spread = prepared_forms.spread_sizes(form.signature, session.graph)
    assert [dict(signature)["x"][0][:2] for signature in spread] == [
        (4, 6), (2, 3), (16, 12), (8, 24), (32, 12), (8, 48), (64, 12), (8, 96)]
    monkeypatch.setattr(prepared_forms, "SPREAD_MAX_BYTES", 0)  # larger feeds: twice at most
    spread = prepared_forms.spread_sizes(form.signature, session.graph)
    assert [dict(signature)["x"][0][:2] for signature in spread] == [
        (4, 6), (2, 3), (16, 12), (8, 24)]
    # one stays one, and no size repeats
    at_one = prepared_forms.spread_sizes(feed_signature(attention_feeds(1, 1)), session.graph)
    assert [dict(signature)["x"][0][:2] for signature in at_one] == [(2, 1), (1, 2)]
    monkeypatch.undo()
    at_one = prepared_forms.spread_sizes(feed_signature(attention_feeds(1, 1)), session.graph)
    assert [dict(signature)["x"][0][:2] for signature in at_one] == [
        (2, 1), (1, 2), (4, 1), (1, 4), (8, 1), (1, 8)]


def test_variants_move_every_free_axis_then_each_to_one():
    sizes = {"batch": 2, "sequence": 9}
    variants = prepared_forms._variants(sizes)
    assert variants[0] == [{"batch": 3, "sequence": 10}, {"batch": 4, "sequence": 11}]
    assert [{"batch": 1, "sequence": 10}, {"batch": 1, "sequence": 11}] in variants
    assert [{"batch": 3, "sequence": 1}, {"batch": 4, "sequence": 1}] in variants
    assert len(variants) == 3  # no smaller sizes: a batch of 2 has none past one
    larger = prepared_forms._variants({"batch": 8, "sequence": 64})
    assert [{"batch": 7, "sequence": 63}, {"batch": 6, "sequence": 62}] in larger
    # dims without a name are grouped by their size, under a tuple key (a TypeError until
    # 2026-11-27, out of wait_compiled, for two such axes)
    unnamed = {("size", 2): 2, ("size", 9): 9}
    assert [{("size", 2): 1, ("size", 9): 10}, {("size", 2): 1, ("size", 9): 11}] \
        in prepared_forms._variants(unnamed)


def test_no_programs_made_where_programs_are_off(monkeypatch, concrete_inferences):
    monkeypatch.setenv("MIXRT_SHAPE_PROGRAMS", "0")
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(2, 9))
    session.wait_compiled(600)
    (form,) = session._trusted_forms.values()
    assert not form.programs and concrete_inferences == []
    signature = feed_signature(attention_feeds(2, 9))
    assert signature_form(signature) in session._trusted_forms


# -- the collector once a session is ready (runtime/collector.py, settle) --------------------

SETTLE_CHILD = """
import gc, sys
import mixrt
sys.path.insert(0, {tests!r})
from test_inferred_plans import attention_feeds, attention_model
session = mixrt.Session(attention_model())
session.run(None, attention_feeds(2, 9))
before = gc.get_freeze_count()
session.wait_compiled(600)
after = gc.get_freeze_count()
session.wait_compiled(0)  # a readiness probe: nothing more is frozen
probed = gc.get_freeze_count()
del session  # its drop thaws them: cycles made before are reclaimed again
print(before, after, probed, gc.get_freeze_count(), gc.isenabled())
"""


@pytest.mark.parametrize("setting, collector_on, frozen", [
    (None, True, True), ("0", True, False), (None, False, False)])
def test_a_ready_session_moves_what_outlives_a_full_pass_out_of_later_ones(
        setting, collector_on, frozen, tmp_path):
    """In a fresh process (freezing is process-wide): the first wait_compiled that finds the
    session ready takes a full pass and freezes what survives it, once; MIXRT_GC_FREEZE=0
    leaves the collector as it is, and a process with the collector off keeps it off. The
    session's drop thaws what was frozen."""
    import os
    import subprocess
    import sys
    code = SETTLE_CHILD.format(tests=os.path.dirname(__file__))
    if not collector_on:
        code = "import gc; gc.disable()\n" + code
    # NumPy kernels alone: no compile child to wait for (the settle is the same)
    environment = dict(os.environ, MIXRT_JIT="0", MIXRT_CACHE_DIR=str(tmp_path / "mixrt"),
                       NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    environment.pop("MIXRT_GC_FREEZE", None)
    if setting is not None:
        environment["MIXRT_GC_FREEZE"] = setting
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=600, check=True)
    before, after, probed, dropped, enabled = done.stdout.split()[-5:]
    assert int(before) == 0 and int(dropped) == 0 and enabled == str(collector_on)
    if frozen:
        assert int(after) > 10_000 and int(probed) == int(after)
    else:
        assert int(after) == 0 and int(probed) == 0


def _batch_mlp() -> bytes:
    """A two-layer MLP over a batch of 8 features: one free axis."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (8, 24)), ("b1", (24,)), ("w2", (24, 3)))]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]) \
        .SerializeToString()


def test_a_batch_form_runs_every_batch_size_so_each_first_request_takes_its_lane():
    """After wait_compiled, a batch size the caller never sent has its plan and bound calls
    (two runs on zeros): its first request takes the steady lane, with onnxruntime's
    answer."""
    from mixrt.runtime.session_feeds import feed_key  # noqa: PLC0415
    data = _batch_mlp()
    session = mixrt.Session(data)
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    session.run(None, {"x": rng.standard_normal((16, 8)).astype(np.float32)})
    session.wait_compiled(600)
    for batch in (1, 5, 13, 16, prepared_forms.LADDER_TOP):
        fed = {"x": rng.standard_normal((batch, 8)).astype(np.float32)}
        steady = session._steady_runs[feed_key(fed)]
        assert any(arena.bound for arena in steady.plan.pool)  # bound: not trimmed either
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-5, atol=1e-5)


def test_ladder_sizes_take_one_free_group_of_small_feeds(monkeypatch):
    data = _batch_mlp()
    session = mixrt.Session(data)
    session.run(None, {"x": np.zeros((4, 8), np.float32)})
    (form,) = session._trusted_forms.values()
    ladder = prepared_forms.ladder_sizes(form.signature, session.graph)
    batches = [dict(signature)["x"][0][0] for signature in ladder]
    assert batches == list(range(1, prepared_forms.LADDER_TOP + 1))
    monkeypatch.setattr(prepared_forms, "SPREAD_MAX_BYTES", 6 * 8 * 4)  # six rows at most
    ladder = prepared_forms.ladder_sizes(form.signature, session.graph)
    assert [dict(signature)["x"][0][0] for signature in ladder] == [1, 2, 3, 4, 5, 6]
    # a batch and a length: too many sizes to run
    attention = mixrt.Session(attention_model())
    attention.run(None, attention_feeds(2, 9))
    (form,) = attention._trusted_forms.values()
    assert prepared_forms.ladder_sizes(form.signature, attention.graph) == []


def test_the_ladder_stops_at_its_budget():
    import time  # noqa: PLC0415
    runs = []

    def run(feeds):
        runs.append(feeds)
        time.sleep(0.02)
    sizes = [(("x", ((batch, 8), "float32")),) for batch in range(1, 11)]
    ran = prepared_forms.run_ladder(sizes, run, budget_s=0.05)
    assert 1 <= len(ran) <= 3 and len(runs) == prepared_forms.LADDER_RUNS * len(ran)
    assert ran == sizes[:len(ran)]
    assert [feeds["x"].shape for feeds in runs[::prepared_forms.LADDER_RUNS]] == \
        [(b, 8) for b in range(1, len(ran) + 1)]
    assert prepared_forms.run_ladder(sizes, run, budget_s=-1.0) == []


def test_reach_sizes_double_each_group_from_sixteen_times_within_the_feeds_bytes():
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(2, 9))
    (form,) = session._trusted_forms.values()
    groups = prepared_forms.reach_sizes(form.signature, session.graph)
    shapes = [[dict(signature)["x"][0][:2] for signature in group] for group in groups]
    # x (b, l, 16) float32 and the mask (b, l) int64: 72 bytes a position, 1 MiB at most
    assert shapes == [[(2, 9), (128, 9), (256, 9), (512, 9), (1024, 9)],
                      [(2, 9), (2, 144), (2, 288), (2, 576), (2, 1152), (2, 2304),
                       (2, 4608)]]


def test_the_reach_runs_within_its_budget_and_stops_a_group_at_a_refusal(monkeypatch):
    # the runs' time on a clock of the test's own, which they advance: slept, a busy host
    # stretched the base run's 1 ms far enough that 128 rows were expected past
    # REACH_RUN_MAX_S, with the suite's other worker busy (2026-12-05)
    now = [0.0]
    monkeypatch.setattr(prepared_forms, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    group = [(("x", ((batch, 8), "float32")),) for batch in (4, 128, 256, 512, 1024)]
    bases, reached = [], []

    def run(feeds):
        bases.append(feeds["x"].shape[0])
        now[0] += 0.001

    def let_go(signature, feeds):  # a run in proportion to the rows, twice
        reached.append(feeds["x"].shape[0])
        now[0] += 2 * 0.001 * feeds["x"].shape[0] / 4
        return 0.001 * feeds["x"].shape[0] / 4, []

    # 32 ms expected at 128 rows, 64 at 256: the second stops at REACH_RUN_MAX_S (50 ms)
    assert prepared_forms.run_reach([group], run, let_go, budget_s=5.0) == 1
    assert bases == [4] and reached == [128]
    reached.clear()
    assert prepared_forms.run_reach([group], run, let_go, budget_s=0.05) == 0  # 2 x 32 ms
    assert reached == []

    def refuse(signature, feeds):
        reached.append(feeds["x"].shape[0])
        if feeds["x"].shape[0] > 128:
            raise ValueError("past the model's positions")
        return 1e-5, []
    assert prepared_forms.run_reach([group, group], run, refuse, budget_s=5.0) == 2
    assert reached == [128, 256, 128, 256]


def test_a_first_large_batch_after_wait_compiled_loads_nothing_and_holds_no_plan(monkeypatch):
    """A batch form warmed at one row: the wait runs the batches past its ladder, so a
    service's first batch of thousands loads no kernel in the request; those runs keep no
    plan, and the arena memory they grew (small here) stays for the batches to come."""
    import numba.core.dispatcher as dispatcher  # noqa: PLC0415
    monkeypatch.setattr(prepared_forms, "rows_stay_apart", lambda graph: False)  # no buckets
    data = _batch_mlp()
    session = mixrt.Session(data)
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros((1, 8), np.float32)})
    session.wait_compiled(600)
    plans = len(session._plans)
    assert all(dict(key)["x"][0][0] <= prepared_forms.LADDER_TOP
               for key in session._plans._items)
    compiles = []
    real = dispatcher.Dispatcher._compile_for_args
    monkeypatch.setattr(dispatcher.Dispatcher, "_compile_for_args",
                        lambda self, *a, **k: compiles.append(self) or real(self, *a, **k))
    x = np.random.default_rng(3).standard_normal((3000, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0],
                               reference.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert compiles == [] and len(session._plans) == plans + 1


def test_the_ladders_sizes_that_missed_a_kernel_run_again_once():
    """A ladder size whose made-up runs met a kernel in no cache answered on the NumPy tier
    and was forgotten: once the child is done, it runs as a ladder's again (planned,
    bound, settled) so a request of it takes its lane; once only."""
    met = ((("x", ((70, 3), "<f4")),), (("x", ((80, 3), "<f4")),))
    prepared = prepared_forms.Prepared(laddered=list(met))
    ran = []
    assert prepared_forms.run_missed(prepared, lambda signature: signature == met[0],
                                     lambda feeds: ran.append(feeds["x"].shape))
    assert ran == [(80, 3)] * prepared_forms.LADDER_RUNS
    assert not prepared_forms.run_missed(prepared, lambda signature: False, ran.append)
