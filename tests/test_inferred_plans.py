"""A new input shape planned from shape inference, without a discovery run
(runtime/inferred_plans.py), and a new shape of a compiled form run compiled at once
(runtime/kernel_tiers.py): what a service sending a new sequence length per request meets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.base.errors import ExecutionError
from mixrt.runtime import fingerprints, kernel_tiers
from mixrt.runtime import session as session_module
from mixrt.runtime.feeds import feed_signature, signature_form

HIDDEN, HEADS = 16, 4


def attention_model(seed: int = 0) -> bytes:
    """One self-attention block as PyTorch exports it: the heads' shapes computed from the
    input's Shape (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), a padding mask,
    the products, softmax and a residual LayerNormalization; batch and sequence symbolic."""
    rng = np.random.default_rng(seed)
    weights = {name: rng.standard_normal(shape).astype(np.float32) * 0.3 for name, shape in
               (("wq", (HIDDEN, HIDDEN)), ("wk", (HIDDEN, HIDDEN)), ("wv", (HIDDEN, HIDDEN)),
                ("scale", (HIDDEN,)), ("bias", (HIDDEN,)))}
    ints = {"zero": [0], "one": [1], "heads": [HEADS], "head_dim": [HIDDEN // HEADS],
            "hidden": [HIDDEN]}
    initializers = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    initializers += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["x_shape", "one"], ["sequence"], axis=0),
        helper.make_node("Concat", ["batch", "sequence", "heads", "head_dim"], ["split_shape"],
                         axis=0),
        helper.make_node("Concat", ["batch", "sequence", "hidden"], ["merged_shape"], axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_flat"]),
                  helper.make_node("Reshape", [f"{name}_flat", "split_shape"], [f"{name}_4d"]),
                  helper.make_node("Transpose", [f"{name}_4d"], [f"{name}_heads"],
                                   perm=[0, 2, 1, 3])]
    nodes += [
        helper.make_node("Transpose", ["k_heads"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_heads", "k_t"], ["scores"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "one"], ["mask_3d"]),
        helper.make_node("Unsqueeze", ["mask_3d", "one"], ["mask_4d"]),
        helper.make_node("Sub", ["one_f", "mask_4d"], ["masked"]),
        helper.make_node("Mul", ["masked", "minus_big"], ["penalty"]),
        helper.make_node("Add", ["scores", "penalty"], ["scored"]),
        helper.make_node("Softmax", ["scored"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "v_heads"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["merged"]),
        helper.make_node("Add", ["merged", "x"], ["residual"]),
        helper.make_node("LayerNormalization", ["residual", "scale", "bias"], ["y"], axis=-1),
    ]
    initializers += [numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
                     numpy_helper.from_array(np.array(-1e4, np.float32), "minus_big")]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def attention_feeds(batch: int, sequence: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed + 100 * batch + sequence)
    mask = np.ones((batch, sequence), np.int64)
    mask[:, sequence - sequence // 3:] = 0  # padding at the end of each row
    return {"x": rng.standard_normal((batch, sequence, HIDDEN)).astype(np.float32),
            "mask": mask}


@pytest.fixture
def discoveries(monkeypatch):
    """How many discovery runs sessions make (Session._discover calls)."""
    calls = []
    original = session_module.Session._discover

    def counted(self, *args, **kwargs):
        calls.append(args[0])
        return original(self, *args, **kwargs)
    monkeypatch.setattr(session_module.Session, "_discover", counted)
    return calls


SHAPES = [(1, 7), (1, 30), (3, 5), (2, 64), (1, 1), (4, 17)]


def test_new_shapes_of_a_known_form_are_planned_without_a_discovery_run(discoveries):
    model = attention_model()
    session = mixrt.Session(model)
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    for batch, sequence in SHAPES:
        feeds = attention_feeds(batch, sequence)
        (ours,) = session.run(None, feeds)
        (theirs,) = reference.run(None, feeds)
        assert ours.shape == (batch, sequence, HIDDEN)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert len(discoveries) == 1, "only the form's first signature runs the discovery way"
    form = signature_form(feed_signature(attention_feeds(*SHAPES[0])))
    assert form in session._trusted_forms


def test_an_inferred_plan_gives_the_bits_of_a_discovered_one(discoveries):
    """The first answer of a shape planned from inference equals, bit for bit, the answer
    of a session that discovered that shape (both are planned runs)."""
    model = attention_model()
    warm = mixrt.Session(model)
    warm.run(None, attention_feeds(2, 9))
    for batch, sequence in SHAPES:
        feeds = attention_feeds(batch, sequence)
        (inferred,) = warm.run(None, feeds)
        (discovered,) = mixrt.Session(model).run(None, feeds)
        np.testing.assert_array_equal(inferred, discovered)
        (again,) = warm.run(None, feeds)  # the plan's later (bound) runs, the same bits
        np.testing.assert_array_equal(again, inferred)



def repeated_shape_arithmetic_model() -> bytes:
    """Two layers' shape arithmetic as an exporter repeats it: each layer takes the Shape of
    the same hidden states and Gathers with an index initializer of its own (equal values),
    so their frozen nodes compute the same thing under other names."""
    nodes, initializers = [], []
    source = "x"
    for layer in range(2):
        prefix = f"layer{layer}_"
        initializers += [numpy_helper.from_array(np.array([0], np.int64), prefix + "zero"),
                         numpy_helper.from_array(np.array([1], np.int64), prefix + "one"),
                         numpy_helper.from_array(np.array([HIDDEN], np.int64), prefix + "width")]
        nodes += [
            helper.make_node("Shape", [source], [prefix + "shape"]),
            helper.make_node("Gather", [prefix + "shape", prefix + "zero"], [prefix + "b"],
                             axis=0),
            helper.make_node("Gather", [prefix + "shape", prefix + "one"], [prefix + "s"],
                             axis=0),
            helper.make_node("Concat", [prefix + "b", prefix + "s", prefix + "width"],
                             [prefix + "target"], axis=0),
            helper.make_node("Relu", [source], [prefix + "act"]),
            helper.make_node("Reshape", [prefix + "act", prefix + "target"], [prefix + "out"]),
        ]
        source = prefix + "out"
    graph = helper.make_graph(
        nodes, "repeated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT,
                                       ["batch", "sequence", HIDDEN])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def test_frozen_nodes_that_compute_alike_each_get_their_own_values(discoveries):
    """The memo of the frozen values is shared by nodes that compute the same thing (a
    layer's Shape of the hidden states, its Gather with an index of its own): each still
    gets its values under its own names, so the new shapes plan from inference."""
    model = repeated_shape_arithmetic_model()
    session = mixrt.Session(model)
    for batch, sequence in SHAPES:
        x = np.random.default_rng(batch * 100 + sequence).standard_normal(
            (batch, sequence, HIDDEN)).astype(np.float32)
        (ours,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(ours, np.maximum(x, 0))
    assert len(discoveries) == 1, "every later signature is planned from inference"


def test_a_forms_plan_structure_is_reused_until_a_size_answers_otherwise(monkeypatch):
    """New signatures of a form reuse its plan structure; one whose output crosses the
    arena's output size (a size-dependent decision) gets a structure of its own, and
    every plan still gives the bits of a discovered one."""
    from mixrt.runtime import executor  # noqa: PLC0415
    monkeypatch.setattr(executor, "ARENA_OUTPUT_BYTES", 4 * HIDDEN * 6)  # under 7 tokens
    model = attention_model()
    session = mixrt.Session(model)
    session.run(None, attention_feeds(1, 3))  # the form's discovery run
    (form,) = session._trusted_forms.values()
    for batch, sequence in [(1, 4), (1, 5), (2, 9), (1, 2), (3, 11)]:
        feeds = attention_feeds(batch, sequence)
        (inferred,) = session.run(None, feeds)
        (discovered,) = mixrt.Session(model).run(None, feeds)
        np.testing.assert_array_equal(inferred, discovered)
    (structures,) = form.structures.values()
    assert len(structures) == 2  # the small outputs' and the large ones'


def test_the_inferred_plans_frozen_values_are_the_shapes_of_the_new_signature():
    model = attention_model()
    session = mixrt.Session(model)
    session.run(None, attention_feeds(1, 8))
    session.run(None, attention_feeds(3, 21))
    plan = session._cached_plan(feed_signature(attention_feeds(3, 21)))
    assert plan is not None and not plan.unproven
    assert list(plan.frozen["split_shape"]) == [3, 21, HEADS, HIDDEN // HEADS]
    assert list(plan.frozen["merged_shape"]) == [3, 21, HIDDEN]
    assert plan.slots["penalty"].shape == (3, 1, 1, 21)  # the mask, broadcast over heads
    assert plan.slots["context_t"].shape == (3, 21, HEADS, HIDDEN // HEADS)
    assert all(slot.static for slot in plan.slots.values())


def nonzero_model() -> bytes:
    """A value whose shape depends on the data (NonZero): inference cannot predict it."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"]),
             helper.make_node("Cast", ["where"], ["where_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["where_f"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9) \
        .SerializeToString()


def test_a_form_whose_shapes_depend_on_the_data_keeps_its_discovery_runs(discoveries):
    session = mixrt.Session(nonzero_model())
    rng = np.random.default_rng(0)
    for size in (5, 9, 14):
        x = (rng.random(size) > 0.5).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        assert float(y) == float(np.nonzero(x)[0].sum())
    assert len(discoveries) == 3
    assert not session._trusted_forms


def test_a_failing_inferred_plan_is_answered_the_discovery_way(monkeypatch, discoveries):
    """Where a run of a plan made from inference fails (inference got a shape wrong), the
    request is answered as before inference planned it, and the form is not trusted again."""
    model = attention_model()
    session = mixrt.Session(model)
    session.run(None, attention_feeds(1, 8))
    original = session_module.execute

    def failing_when_inferred(steps, env, xp, arena=None, plan=None, **options):
        if plan is not None and plan.unproven:
            raise ExecutionError("node 'made up' failed: a shape inference got wrong")
        return original(steps, env, xp, arena, plan, **options)
    monkeypatch.setattr(session_module, "execute", failing_when_inferred)
    feeds = attention_feeds(2, 11)
    (ours,) = session.run(None, feeds)
    (theirs,) = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]) \
        .run(None, feeds)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert len(discoveries) == 2  # the form's first signature, then the fallback
    assert not session._trusted_forms
    session.run(None, attention_feeds(3, 4))
    assert len(discoveries) == 3


def test_a_models_own_error_is_still_named_on_an_inferred_plan():
    """A feed that breaks the model (a sequence longer than a constant it is added to)
    raises the error a discovery run raises, naming the node, not a planning error."""
    rng = np.random.default_rng(0)
    positions = numpy_helper.from_array(rng.standard_normal((1, 8, 4)).astype(np.float32),
                                        "positions")
    nodes = [helper.make_node("Add", ["x", "positions"], ["y"], name="add_positions")]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])], [positions])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = mixrt.Session(model.SerializeToString())
    session.run(None, {"x": np.zeros((1, 8, 4), np.float32)})
    with pytest.raises(mixrt.errors.MixrtError, match="add_positions"):
        session.run(None, {"x": np.zeros((1, 5, 4), np.float32)})
    # one bad request does not take the form's inferred plans away from the good ones
    assert session._trusted_forms and not session._distrusted_forms



@pytest.mark.parametrize("export", ["scaled_logreg_cancer.nozipmap.onnx",  # binary
                                    "onehot_logreg_iris.nozipmap.onnx"])  # three classes
def test_a_linear_classifiers_new_batches_are_planned_from_inference(export, discoveries):
    """Inference knows a LinearClassifier's score columns from its attributes, so a new
    batch of a scikit-learn logistic regression needs no discovery run."""
    path = str(Path(__file__).parent / "data" / "sklearn_exports" / export)
    session = mixrt.Session(path)
    reference = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (spec,) = [i for i in reference.get_inputs()]
    rng = np.random.default_rng(0)
    for batch in (3, 1, 8, 5):
        shape = [batch if not isinstance(d, int) else d for d in spec.shape]
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        ours, theirs = session.run(None, {spec.name: x}), reference.run(None, {spec.name: x})
        np.testing.assert_array_equal(ours[0], theirs[0])
        np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)
    assert len(discoveries) == 1 and session._trusted_forms

# -- the kernel tiers: a new size of a compiled form --------------------------------------

needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="needs numba")


@needs_numba
def test_a_new_shape_of_a_compiled_form_runs_compiled_without_a_child(tmp_path, monkeypatch):
    from test_kernel_tiers import WAIT, feeds, pool_norm_model  # noqa: PLC0415
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path / "mixrt"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    fingerprints._stamp.clear()
    session = mixrt.Session(pool_norm_model())
    session.run(None, feeds(batch=2))
    assert session.wait_compiled(timeout=WAIT)
    children = kernel_tiers.compiler().children
    for batch in (3, 7, 5):  # new sizes, one form: the kernels are loaded already
        y = session.run(None, feeds(batch=batch))[0]
        assert y.shape == (batch, 8)
    assert set(session._tiers.states().values()) == {"compiled"}
    assert kernel_tiers.compiler().children == children
    # and the next process finds the form's marker: its first new size runs compiled too
    assert list((tmp_path / "mixrt" / "warm").glob("form-*.json"))


# -- the cycle collector while a new shape is planned (runtime/collector.py) ----------------

def test_the_collector_is_held_off_while_a_new_shape_is_planned_and_on_after(monkeypatch):
    """Inference and the plan of a new shape run with the collector off (their burst of
    short-lived objects dies before a pass promotes it); the run, and the caller after it,
    have it on again, and a new shape still makes no collection of its own."""
    import gc
    seen = []
    original = session_module.plan_for_form

    def watched(*args):
        seen.append(gc.isenabled())
        return original(*args)
    monkeypatch.setattr(session_module, "plan_for_form", watched)
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(1, 7))  # the form's discovery run
    assert gc.isenabled()
    for batch, sequence in SHAPES[1:]:
        session.run(None, attention_feeds(batch, sequence))
        assert gc.isenabled()
    assert seen == [False] * (len(SHAPES) - 1)


def test_a_collector_turned_off_by_the_process_stays_off():
    import gc
    from mixrt.runtime import collector
    gc.disable()
    try:
        with collector.held_off():
            assert not gc.isenabled()
        assert not gc.isenabled()
        session = mixrt.Session(attention_model())
        for batch, sequence in SHAPES[:3]:
            session.run(None, attention_feeds(batch, sequence))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_holds_from_several_threads_turn_the_collector_on_once_the_last_ends():
    import gc
    import threading
    from mixrt.runtime import collector
    entered, release = threading.Barrier(3), threading.Event()

    def hold():
        with collector.held_off():
            entered.wait()
            release.wait()
    threads = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        entered.wait(timeout=30)
        assert not gc.isenabled()
        with collector.held_off():  # a third hold that ends first
            pass
        assert not gc.isenabled()
    finally:  # a failed check must not leave the threads waiting
        release.set()
        for thread in threads:
            thread.join(timeout=30)
    assert gc.isenabled()
