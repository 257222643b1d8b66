"""A form's shape program (runtime/shape_programs.py): a new signature's shapes and shape
arithmetic computed by one function of its sizes, guarded, checked against inference."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime import inferred_plans, shape_programs, shape_rules
from mixrt.runtime.feeds import feed_signature, signature_form
from mixrt.runtime.inferred_plans import ComputedFrozenValues
from mixrt.runtime.shape_programs import agrees, planned_names, trace
from mixrt.runtime.symbolic_dims import NotSymbolic, Trace
from test_inferred_plans import attention_feeds, attention_model

HIDDEN = 16


def _serialized(graph) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def _both(data: bytes):
    """A mixrt session and an onnxruntime one of the same model."""
    return mixrt.Session(data), onnxruntime.InferenceSession(
        data, providers=["CPUExecutionProvider"])


def test_dims_write_each_expression_once_and_guard_each_comparison():
    dims = Trace()
    length = dims.variable("d0", 7)
    doubled, again = length * 2, 2 * length
    assert doubled.code == again.code and doubled.value == 14
    assert (length + 0) is length and length * 1 is length
    assert not length == 1 and length > 3
    assert "if not (d0 != 1): return None" in dims.lines
    assert "if not (d0 > 3): return None" in dims.lines
    with pytest.raises(NotSymbolic):
        int(length)  # a dim read as a number would fix the program at 7 with no guard
    with pytest.raises(NotSymbolic):
        np.array([length], np.int64)


def positions_model() -> bytes:
    """Position embeddings as transformers export them: Range over the input's length, a
    Gather from the table, a mask broadcast from (batch, length), and a Reshape whose
    target is computed from the input's Shape."""
    rng = np.random.default_rng(3)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((64, HIDDEN)).astype(np.float32), "table"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([-1, 4], np.int64), "tail"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Gather", ["table", "positions"], ["embedded"], axis=0),
        helper.make_node("Add", ["x", "embedded"], ["placed"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis1"], ["mask_3d"]),
        helper.make_node("Transpose", ["mask_3d"], ["mask_t"], perm=[0, 2, 1]),
        helper.make_node("Mul", ["placed", "mask_t"], ["masked"]),
        helper.make_node("Reshape", ["masked", "tail"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", HIDDEN]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], initializers)
    return _serialized(graph)


def positions_feeds(batch: int, length: int) -> dict:
    rng = np.random.default_rng(batch * 100 + length)
    return {"x": rng.standard_normal((batch, length, HIDDEN)).astype(np.float32),
            "mask": (rng.random((batch, length)) > 0.3).astype(np.int64)}


@pytest.fixture
def concrete_inferences(monkeypatch):
    """How many times a new signature was typed by concrete inference (not by a program)."""
    calls = []
    original = inferred_plans.ShapeProgram.infer

    def counted(self, feeds, settle):
        calls.append(feed_signature(feeds))
        return original(self, feeds, settle)

    monkeypatch.setattr(inferred_plans.ShapeProgram, "infer", counted)
    return calls


@pytest.mark.parametrize("model, feeds", [(attention_model, attention_feeds),
                                          (positions_model, positions_feeds)])
def test_new_lengths_are_planned_by_the_forms_program(model, feeds, concrete_inferences):
    data = model()
    session, reference = _both(data)
    for length in (6, 9, 13, 17, 22, 30, 41):
        fed = feeds(2, length)
        got = session.run(None, fed)[0]
        np.testing.assert_allclose(got, reference.run(None, fed)[0], rtol=1e-4, atol=1e-5)
    form = session._trusted_forms[signature_form(feed_signature(feeds(2, 6)))]
    assert form.programs and form.programs[0].confirmed
    # 6 discovered, 9 traced, 13 confirmed it: the later lengths ran no concrete inference
    assert len(concrete_inferences) == 2


def _concrete(session, fed: dict):
    """What concrete inference gives for ``fed`` in ``session``'s trusted form."""
    signature = feed_signature(fed)
    form = session._trusted_forms[signature_form(signature)]
    program = inferred_plans.ShapeProgram(session.graph)
    settle = ComputedFrozenValues(session._bound.nodes, session._bound.constants, form.frozen,
                                  program)
    return signature, program.infer(fed, settle), settle.values


@pytest.mark.parametrize("model, feeds", [(attention_model, attention_feeds),
                                          (positions_model, positions_feeds)])
def test_a_program_gives_what_inference_gives_at_signatures_it_was_not_traced_at(model, feeds):
    session = mixrt.Session(model())
    session.run(None, feeds(3, 11))
    signature, inferred, frozen = _concrete(session, feeds(3, 12))
    program = trace(session._bound.nodes, session._bound.constants, signature, inferred,
                    frozen, planned_names(session._bound.nodes, frozen))
    assert program is not None
    rng = np.random.default_rng(7)
    answered = 0
    for _ in range(40):
        fed = feeds(int(rng.integers(1, 6)), int(rng.integers(1, 60)))
        signature, inferred, frozen = _concrete(session, fed)
        answer = program.evaluate(signature)
        if answer is not None:  # where its guards hold, it is right
            answered += 1
            assert agrees(answer, inferred, frozen), signature
    assert answered >= 25


def test_a_size_its_guards_exclude_takes_the_concrete_way(concrete_inferences):
    """A batch of 1 broadcasts where a batch of 2 did not: the program traced at batch 2
    returns None there, and the plan comes from concrete inference (and a program of its
    own)."""
    data = attention_model()
    session, reference = _both(data)
    for batch, length in ((2, 5), (2, 8), (2, 11), (1, 9), (1, 12), (1, 15), (2, 19)):
        fed = attention_feeds(batch, length)
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-4, atol=1e-5)
    form = session._trusted_forms[signature_form(feed_signature(attention_feeds(2, 5)))]
    assert len(form.programs) == 2 and all(made.confirmed for made in form.programs)
    assert len(concrete_inferences) == 4  # two to trace and confirm each program


def test_a_program_its_guards_exclude_runs_no_kernel(monkeypatch):
    """Every line of dims and guards comes before the first line that makes an array, so
    the program of a batch of 2, asked at a batch of 1 (a form's other program), answers
    None before any kernel call or array."""
    data = positions_model()
    session = mixrt.Session(data)
    for batch, length in ((2, 5), (2, 9), (1, 7), (1, 11)):
        session.run(None, positions_feeds(batch, length))
    form = session._trusted_forms[signature_form(feed_signature(positions_feeds(2, 5)))]
    programs = {made.evaluate(feed_signature(positions_feeds(2, 13))) is not None: made
                for made in form.programs}
    assert set(programs) == {True, False}
    wide = programs[True]  # the batch of 2's
    lines = [line.strip() for line in wide.source.splitlines()[1:]]
    first_array = next(at for at, line in enumerate(lines)
                       if "_call(" in line or "_np_array(" in line or "_Shaped(" in line)
    assert all(not line.startswith(("v", "if not")) for line in lines[first_array:])
    assert "_call(" in wide.source  # the Range over the length is a kernel's
    called = []
    namespace = wide._function.__globals__
    monkeypatch.setitem(namespace, "_call", lambda *args: called.append(args))
    monkeypatch.setitem(namespace, "_np_array", lambda *args: called.append(args))
    assert wide.evaluate(feed_signature(positions_feeds(1, 13))) is None
    assert not called


def vision_model() -> bytes:
    """Conv (padded, strided), MaxPool with ceil_mode, a global pool and a classifier,
    over images of any size."""
    rng = np.random.default_rng(5)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["conv"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[3, 3], strides=[2, 2],
                         ceil_mode=1),
        helper.make_node("GlobalAveragePool", ["pool"], ["global"]),
        helper.make_node("Flatten", ["global"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "vision",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], initializers)
    return _serialized(graph)


def test_new_image_sizes_are_planned_by_the_forms_program(concrete_inferences):
    data = vision_model()
    session, reference = _both(data)
    rng = np.random.default_rng(11)
    for _ in range(12):
        image = rng.standard_normal((int(rng.integers(1, 4)), 3, int(rng.integers(9, 70)),
                                     int(rng.integers(9, 70)))).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"image": image})[0],
                                   reference.run(None, {"image": image})[0],
                                   rtol=1e-4, atol=1e-4)
    form = next(iter(session._trusted_forms.values()))
    assert form.programs and form.programs[0].confirmed
    assert len(concrete_inferences) < 11


def _run_attention(lengths) -> mixrt.Session:
    data = attention_model()
    session, reference = _both(data)
    for length in lengths:
        fed = attention_feeds(2, length)
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-4, atol=1e-5)
    return session


def test_an_op_without_a_rule_is_typed_by_its_infer_function_over_named_dims(monkeypatch):
    monkeypatch.delitem(shape_rules._RULES, "LayerNormalization")
    asked = []
    original = shape_programs._Tracer._named_inference

    def named(self, node, kernel, inputs):
        asked.append(node.op_type)
        return original(self, node, kernel, inputs)

    monkeypatch.setattr(shape_programs._Tracer, "_named_inference", named)
    form = next(iter(_run_attention((5, 8, 11, 14))._trusted_forms.values()))
    assert "LayerNormalization" in asked and form.programs[0].confirmed


def test_an_op_neither_a_rule_nor_its_infer_function_follows_keeps_concrete_inference(
        monkeypatch, concrete_inferences):
    monkeypatch.delitem(shape_rules._RULES, "LayerNormalization")

    def unknown(self, node, kernel, inputs):
        raise NotSymbolic("a dim its infer function computes")

    monkeypatch.setattr(shape_programs._Tracer, "_named_inference", unknown)
    form = next(iter(_run_attention((5, 8, 11, 14))._trusted_forms.values()))
    assert form.programs == [] and len(concrete_inferences) == 3


def test_a_program_that_holds_only_where_it_was_traced_is_dropped(monkeypatch,
                                                                   concrete_inferences):
    """A rule that fixes a dim at its traced number without a guard (the fault a guard
    exists to prevent) gives a program that agrees where it was traced and nowhere else:
    the confirmation at the next signature drops it, and the form stops tracing."""
    original = shape_rules._RULES["MatMul"]

    def fixed(node, inputs):
        return [tuple(getattr(dim, "value", dim) for dim in shape)
                for shape in original(node, inputs)]

    monkeypatch.setitem(shape_rules._RULES, "MatMul", fixed)
    form = next(iter(_run_attention((5, 8, 11, 14, 17))._trusted_forms.values()))
    assert form.programs == [] and form.traces_left[0] == 0
    assert len(concrete_inferences) == 4


def test_threads_planning_new_lengths_of_one_form_at_once_get_their_own_answers():
    """Sessions serve several threads: each new length is right whichever thread traced,
    confirmed or reordered the form's programs meanwhile."""
    import threading
    data = attention_model()
    session, reference = _both(data)
    failures = []

    def serve(seed: int):
        rng = np.random.default_rng(seed)
        for _ in range(12):
            fed = attention_feeds(int(rng.integers(1, 4)), int(rng.integers(2, 40)), seed)
            try:
                np.testing.assert_allclose(session.run(None, fed)[0],
                                           reference.run(None, fed)[0], rtol=1e-4, atol=1e-5)
            except AssertionError as error:
                failures.append(error)

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def channel_shuffle_model() -> bytes:
    """ShuffleNet's channel shuffle as torchvision exports it: the channels per group from
    an integer Div of 0-d shape values (whose kernel answers a NumPy scalar)."""
    constants = {"zero": 0, "one": 1, "two": 2, "three": 3}
    initializers = [numpy_helper.from_array(np.array(v, np.int64), k)
                    for k, v in constants.items()]
    initializers += [numpy_helper.from_array(np.array([0], np.int64), "axis0"),
                     numpy_helper.from_array(np.array([2], np.int64), "groups")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"])]
    for index, name in enumerate(("n", "c", "h", "w")):
        nodes.append(helper.make_node("Gather", ["s", ("zero", "one", "two", "three")[index]],
                                      [name], axis=0))
    nodes += [
        helper.make_node("Div", ["c", "two"], ["per_group"]),
        *[helper.make_node("Unsqueeze", [name, "axis0"], [f"{name}_1"])
          for name in ("n", "per_group", "h", "w")],
        helper.make_node("Concat", ["n_1", "groups", "per_group_1", "h_1", "w_1"], ["split"],
                         axis=0),
        helper.make_node("Reshape", ["r", "split"], ["grouped"]),
        helper.make_node("Transpose", ["grouped"], ["shuffled"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["shuffled", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "shuffle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, "h", "w"])],
        initializers)
    return _serialized(graph)


def test_a_channel_shuffles_new_sizes_are_planned_from_inference(concrete_inferences,
                                                                 monkeypatch):
    from mixrt.runtime import session as session_module
    discovered = []
    original = session_module.Session._discover

    def counted(self, signature, *args, **kwargs):
        discovered.append(signature)
        return original(self, signature, *args, **kwargs)

    monkeypatch.setattr(session_module.Session, "_discover", counted)
    data = channel_shuffle_model()
    session, reference = _both(data)
    rng = np.random.default_rng(2)
    for batch, size in ((1, 6), (3, 9), (2, 5), (4, 11), (1, 7)):
        image = rng.standard_normal((batch, 8, size, size + 1)).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": image})[0],
                                      reference.run(None, {"x": image})[0])
    assert len(discovered) == 1  # the form's first signature only
    form = next(iter(session._trusted_forms.values()))
    assert form.programs and form.programs[0].confirmed


def quantized_model() -> bytes:
    """QOperator convolution between QuantizeLinear and DequantizeLinear, then a dynamic
    quantization and an integer product, over images of any size."""
    rng = np.random.default_rng(9)
    scalars = {"x_scale": np.float32(0.05), "w_scale": np.float32(0.02),
               "y_scale": np.float32(0.1), "zero": np.uint8(128), "w_zero": np.int8(0)}
    initializers = [numpy_helper.from_array(np.array(v), k) for k, v in scalars.items()]
    initializers += [
        numpy_helper.from_array(rng.integers(-20, 20, (4, 3, 3, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(rng.integers(0, 9, (3, 5)).astype(np.uint8), "m"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "x_scale", "zero", "w", "w_scale", "w_zero",
                                         "y_scale", "zero"], ["yq"], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "zero"], ["y"]),
        helper.make_node("DynamicQuantizeLinear", ["y"], ["dq", "dq_scale", "dq_zero"]),
        helper.make_node("MatMulInteger", ["dq", "m"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.INT32, None)], initializers)
    return _serialized(graph)


def test_quantized_operators_new_sizes_are_planned_by_the_forms_program(concrete_inferences):
    data = quantized_model()
    session, reference = _both(data)
    rng = np.random.default_rng(4)
    for batch, height in ((1, 8), (2, 11), (3, 7), (2, 14), (3, 9), (4, 12)):
        image = rng.standard_normal((batch, 3, height, 6)).astype(np.float32)
        for got, expected in zip(session.run(None, {"x": image}),
                                 reference.run(None, {"x": image})):
            np.testing.assert_array_equal(got, expected)
    form = next(iter(session._trusted_forms.values()))
    assert form.programs and form.programs[0].confirmed
    assert len(concrete_inferences) == 2


def _layers_of_reshapes(layers: int) -> bytes:
    """``layers`` blocks that each reshape the hidden states to heads and back by targets
    computed from the input's Shape, as each layer of an exported transformer does."""
    heads = numpy_helper.from_array(np.array([4, HIDDEN // 4], np.int64), "heads")
    flat = numpy_helper.from_array(np.array([HIDDEN], np.int64), "flat")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "two"], ["lead"])]
    value = "x"
    for layer in range(layers):
        nodes += [
            helper.make_node("Concat", ["lead", "heads"], [f"split{layer}"], axis=0),
            helper.make_node("Reshape", [value, f"split{layer}"], [f"h{layer}"]),
            helper.make_node("Relu", [f"h{layer}"], [f"r{layer}"]),
            helper.make_node("Concat", ["lead", "flat"], [f"join{layer}"], axis=0),
            helper.make_node("Reshape", [f"r{layer}", f"join{layer}"], [f"y{layer}"])]
        value = f"y{layer}"
    initializers = [heads, flat, numpy_helper.from_array(np.array([0], np.int64), "zero"),
                    numpy_helper.from_array(np.array([2], np.int64), "two")]
    graph = helper.make_graph(
        nodes, "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", HIDDEN])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, None)], initializers)
    return _serialized(graph)


def test_a_program_computes_each_alike_value_once():
    """Four layers reshape to the same targets: the program makes each target array and
    each shape once, and the values that are alike share them (read only). At opt_level 0:
    from level 1 the graph's repeated Concats are merged before any program is traced
    (``runtime/passes/merge_duplicates.py``), and what is tested here is the program's own
    sharing, which values computed alike by different nodes need."""
    data = _layers_of_reshapes(4)
    session, reference = _both(data)
    session = mixrt.Session(data, opt_level=0)
    for length in (5, 8, 13, 21):
        fed = {"x": np.random.default_rng(length).standard_normal(
            (2, length, HIDDEN)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-6)
    (form,) = session._trusted_forms.values()
    program = form.programs[0]
    made = [line.split(" = ", 1)[1] for line in program.source.splitlines()
            if line.strip().startswith("f")]
    assert made and len(made) == len(set(made))  # each expression computed once
    # the shape, its lead and the two targets: four arrays, not two more a layer
    assert program.source.count("_np_array(") == 4
    observed, frozen = program.evaluate(feed_signature(fed))
    assert frozen["split0"] is frozen["split3"] and frozen["join1"] is frozen["join2"]
    assert observed["h0"] is observed["h3"]
