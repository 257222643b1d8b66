"""A planned CPU run's bound calls (ops/compiled/bound_calls.py, run_loop.bind_calls): after
an arena's first run its steps call the route their kernel settled on, and give the very
bits the kernels give; feeds, whose layout a caller chooses, never decide a bound route."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime import run_loop


def _attention_block(hidden=64, tokens=16):
    """One small self-attention layer as exporters write it (dense layers with biases,
    reshapes and transposes per head, scaled scores and their Softmax, which mixrt fuses
    into one attention node), LayerNormalization, a feed-forward with Relu, a Softmax over
    its output and a Gather of the first token (a pooler's)."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32),
                                       name)
    heads, size = 2, hidden // 2
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]),
             helper.make_node("Add", ["q0", "bq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k0"]),
             helper.make_node("Add", ["k0", "bk"], ["k"]),
             helper.make_node("Reshape", ["q", "heads"], ["qh"]),
             helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["k", "heads"], ["kh"]),
             helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "qt"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ctxt", "flat"], ["c"]),
             helper.make_node("Add", ["c", "x"], ["res"]),
             helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["ln"],
                              axis=-1),
             helper.make_node("MatMul", ["ln", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["y0"]),
             helper.make_node("Softmax", ["y0"], ["s"], axis=-1),
             helper.make_node("Add", ["s", "ln"], ["y"]),
             helper.make_node("Gather", ["s", "first"], ["pooled"], axis=1),
             helper.make_node("Tanh", ["pooled"], ["pooled_tanh"])]
    initializers = [
        weight("wq", hidden, hidden), weight("bq", hidden), weight("wk", hidden, hidden),
        weight("bk", hidden), weight("w1", hidden, 4 * hidden), weight("b1", 4 * hidden),
        weight("w2", 4 * hidden, hidden), weight("gamma", hidden), weight("beta", hidden),
        numpy_helper.from_array(np.array([1, tokens, heads, size], np.int64), "heads"),
        numpy_helper.from_array(np.array([1, tokens, hidden], np.int64), "flat"),
        numpy_helper.from_array(np.array(size ** -0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(0, np.int64), "first")]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, hidden]),
         helper.make_tensor_value_info("pooled_tanh", TensorProto.FLOAT, [1, hidden])],
        initializers)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seed):
    return {"x": np.random.default_rng(seed).standard_normal((1, 16, 64)).astype(np.float32)}


def _bound_ops(session) -> set:
    """The op types whose steps run bound in the arenas of the session's last plan."""
    plan = session._last_plan[1]
    return {step.node.op_type for arena in plan.pool for calls in arena.bound.values()
            for step, _, _, _, form in run_loop.each_call(calls)
            if form is not None and form[6] is not None}


@pytest.fixture
def unbound(monkeypatch):
    """Runs with the kernels called every time (MIXRT_BIND=0)."""
    def run(session, feeds):
        monkeypatch.setattr(run_loop, "BIND", False)
        try:
            return session.run(None, feeds)
        finally:
            monkeypatch.setattr(run_loop, "BIND", True)
    return run


def test_bound_runs_give_the_kernels_bits(unbound):
    session = mixrt.Session(_attention_block())
    for seed in range(4):  # the first run binds, the later ones run bound
        expected = unbound(session, _feeds(seed))
        got = session.run(None, _feeds(seed))
        for mine, theirs in zip(got, expected):
            np.testing.assert_array_equal(mine, theirs)
    bound = _bound_ops(session)
    # the products, their bias adds, the softmax, the transposes and the pooler's gather
    # are the kernels' settled routes, no longer their checks
    assert {"FusedMatMul", "MatMul", "Softmax", "Transpose", "Gather"} <= bound, bound


@pytest.mark.parametrize("tokens", [8, 16])
def test_few_rows_products_are_bound_with_the_kernels_bits(unbound, tokens):
    """A few tokens against 256-wide weights: the products take the compiled few-rows loop
    (eight rows: ``row_kernels.few_rows_call``) or the transposed product (more), which a
    bound step calls straight."""
    session = mixrt.Session(_attention_block(hidden=256, tokens=tokens))
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, tokens, 256))
                 .astype(np.float32)}
        expected = unbound(session, feeds)
        for mine, theirs in zip(session.run(None, feeds), expected):
            np.testing.assert_array_equal(mine, theirs)
    assert "FusedMatMul" in _bound_ops(session)


def test_feeds_of_another_layout_still_answer_rightly():
    """A feed is never a bound input: the step that reads it calls its kernel, which
    looks at the layout it is given (here a transposed view, then a contiguous copy)."""
    session = mixrt.Session(_attention_block())
    x = _feeds(1)["x"]
    first = session.run(None, {"x": x})
    session.run(None, {"x": x})
    strided = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
    assert not strided.flags.c_contiguous
    for mine, theirs in zip(session.run(None, {"x": strided}), first):
        np.testing.assert_array_equal(mine, theirs)


def _small_gemms(hidden=64, rows=8):
    """Two Gemm layers of a few rows under the panels' reach (GPT-2's Conv1D at hidden 64
    over 8 tokens), the second transposed and scaled, between Relus (so their inputs are
    the arena's, not the feed)."""
    rng = np.random.default_rng(3)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32),
                                       name)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gemm", ["r", "w1", "b1"], ["g1"]),
             helper.make_node("Relu", ["g1"], ["h"]),
             helper.make_node("Gemm", ["h", "w2", "b2"], ["g2"], transB=1, alpha=0.5,
                              beta=2.0),
             helper.make_node("Relu", ["g2"], ["y"])]
    wide = 3 * hidden
    graph = helper.make_graph(
        nodes, "gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, hidden])],
        [weight("w1", hidden, wide), weight("b1", wide), weight("w2", hidden, wide),
         weight("b2", hidden)])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("hidden, rows", [(64, 8), (256, 8), (256, 16)])
def test_small_gemms_are_bound_to_the_blas_product_with_the_kernels_bits(unbound, hidden, rows):
    """At 64 wide the BLAS's product; at 256 the few-rows forms (the compiled loop for 8
    rows, the transposed product for 16), B packed (transB 0) or read as rows (transB 1)."""
    session = mixrt.Session(_small_gemms(hidden, rows), opt_level=0)  # Gemm as Gemm
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).standard_normal((rows, hidden))
                 .astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], unbound(session, feeds)[0])
    assert "Gemm" in _bound_ops(session)



@pytest.mark.parametrize("hidden, rows", [(64, 3), (256, 3), (256, 12)])
def test_small_fused_gemms_are_bound_with_the_kernels_bits(unbound, hidden, rows):
    """Gemm + Relu fused (FusedGemm) at a few rows under the panels' reach: bound to the
    product the kernel comes to (the BLAS's at 64 wide, the few-rows forms at 256), then
    the terms and the activation."""
    session = mixrt.Session(_small_gemms(hidden, rows))
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).standard_normal((rows, hidden))
                 .astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], unbound(session, feeds)[0])
    assert "FusedGemm" in _bound_ops(session)

def _masked_scores(tokens=8, vocab=11, hidden=16):
    """The attention mask's steps as transformers' exports write them (an int64 mask cast,
    inverted, unsqueezed and expanded to the scores' shape, chosen between two constants by
    Where; the Softmax's NaN rows zeroed by IsNaN and Where), with comparisons and logic on
    the scores and an embeddings sum of three gathered rows (a fused chain of adds)."""
    rng = np.random.default_rng(3)
    const = numpy_helper.from_array
    nodes = [
        helper.make_node("Cast", ["mask"], ["mask_bool"], to=TensorProto.BOOL),
        helper.make_node("Not", ["mask_bool"], ["hidden_pos"]),
        helper.make_node("Unsqueeze", ["hidden_pos", "axes"], ["hidden4"]),
        helper.make_node("Expand", ["hidden4", "square"], ["hidden_sq"]),
        helper.make_node("Where", ["hidden_sq", "minus_big", "zero"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["probs"]),
        helper.make_node("Less", ["scores", "zero"], ["negative"]),
        helper.make_node("IsInf", ["scores"], ["infinite"]),
        helper.make_node("Or", ["negative", "infinite"], ["odd"]),
        helper.make_node("Equal", ["scores", "scores"], ["same"]),
        helper.make_node("Xor", ["odd", "same"], ["flags"]),
        helper.make_node("Cast", ["flags"], ["flags_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["probs", "flags_f"], ["out"]),
        helper.make_node("Gather", ["table", "ids"], ["e1"], axis=0),
        helper.make_node("Gather", ["types", "kinds"], ["e2"], axis=0),
        helper.make_node("Add", ["e1", "e2"], ["e12"]),
        helper.make_node("Add", ["e12", "positions"], ["embedded"])]
    initializers = [
        const(np.array([1, 2], np.int64), "axes"),
        const(np.array([1, 1, tokens, tokens], np.int64), "square"),
        const(np.array(-1e4, np.float32), "minus_big"),
        const(np.array(0.0, np.float32), "zero"),
        const(rng.standard_normal((vocab, hidden)).astype(np.float32), "table"),
        const(rng.standard_normal((2, hidden)).astype(np.float32), "types"),
        const(rng.standard_normal((1, tokens, hidden)).astype(np.float32), "positions")]
    graph = helper.make_graph(
        nodes, "masked",
        [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, tokens]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, tokens, tokens]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, tokens]),
         helper.make_tensor_value_info("kinds", TensorProto.INT64, [1, tokens])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, tokens, tokens]),
         helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, tokens, hidden])],
        initializers)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def _masked_feeds(seed, tokens=8):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((1, 1, tokens, tokens)).astype(np.float32)
    scores[0, 0, 1, 2] = np.inf
    scores[0, 0, 3, :] = np.nan  # a row the Softmax makes NaN, zeroed by the Where
    return {"mask": (rng.random((1, tokens)) < 0.7).astype(np.int64), "scores": scores,
            "ids": rng.integers(0, 11, (1, tokens)), "kinds": rng.integers(0, 2, (1, tokens))}


def test_the_attention_masks_steps_are_bound_with_the_kernels_bits(unbound):
    session = mixrt.Session(_masked_scores())
    for seed in range(4):
        expected = unbound(session, _masked_feeds(seed))
        got = session.run(None, _masked_feeds(seed))
        for mine, theirs in zip(got, expected):
            np.testing.assert_array_equal(mine, theirs)
    bound = _bound_ops(session)
    assert {"Cast", "Not", "Expand", "Where", "IsNaN", "IsInf", "Less", "Or", "Equal", "Xor",
            "FusedElementwise"} <= bound, bound


def test_the_mask_steps_match_onnxruntime():
    onnxruntime = pytest.importorskip("onnxruntime")
    model = _masked_scores()
    session = mixrt.Session(model)
    reference = onnxruntime.InferenceSession(model.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = _masked_feeds(seed)
        for mine, theirs in zip(session.run(None, feeds), reference.run(None, feeds)):
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-6)


def _split_heads(tokens=8, hidden=16, heads=2):
    """GPT-2's attention as its export writes it: one product makes q, k and v side by side,
    Split cuts them apart (views of the product), each is reshaped into heads and
    transposed, and the keys are transposed once more to be the scores' second operand (a
    view the product reads in place); a causal mask chooses the scores; the token ids are reshaped (a view of the feed) before
    their embedding Gather."""
    rng = np.random.default_rng(5)
    size = hidden // heads
    const = numpy_helper.from_array
    nodes = [helper.make_node("Reshape", ["ids", "flat_ids"], ["ids_flat"]),
             helper.make_node("Gather", ["table", "ids_flat"], ["x"], axis=0),
             helper.make_node("MatMul", ["x", "w"], ["qkv"]),
             helper.make_node("Split", ["qkv", "thirds"], ["q", "k", "v"], axis=-1)]
    for part in "qkv":
        nodes += [helper.make_node("Reshape", [part, "per_head"], [f"{part}h"]),
                  helper.make_node("Transpose", [f"{part}h"], [f"{part}t"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kt"], ["kT"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qt", "kT"], ["scores"]),
              helper.make_node("Where", ["causal", "scores", "minus_big"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "joined"], ["y"])]
    initializers = [
        const(np.array([1, tokens], np.int64), "flat_ids"),
        const(rng.standard_normal((13, hidden)).astype(np.float32), "table"),
        const((rng.standard_normal((hidden, 3 * hidden)) * 0.3).astype(np.float32), "w"),
        const(np.array([hidden] * 3, np.int64), "thirds"),
        const(np.array([1, tokens, heads, size], np.int64), "per_head"),
        const(np.array([1, tokens, hidden], np.int64), "joined"),
        const(np.tril(np.ones((tokens, tokens), bool)), "causal"),
        const(np.array(-1e4, np.float32), "minus_big")]
    graph = helper.make_graph(
        nodes, "split_heads",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [tokens])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, hidden])],
        initializers)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def _ids(seed, tokens=8):
    return {"ids": np.random.default_rng(seed).integers(0, 13, tokens)}


def test_steps_behind_a_split_are_bound_with_the_kernels_bits(unbound):
    """Split's parts and the transposed keys are views of the same memory every run: bound,
    they let the reshapes, transposes and products behind them be bound too."""
    session = mixrt.Session(_split_heads())
    for seed in range(4):
        expected = unbound(session, _ids(seed))
        got = session.run(None, _ids(seed))
        np.testing.assert_array_equal(got[0], expected[0])
    bound = _bound_ops(session)
    assert {"Split", "Transpose", "MatMul", "Gather"} <= bound, bound


def test_a_feeds_reshape_views_it_and_strided_feeds_still_answer_rightly():
    onnxruntime = pytest.importorskip("onnxruntime")
    model = _split_heads()
    reference = onnxruntime.InferenceSession(model.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    session = mixrt.Session(model)
    for seed in range(3):
        feeds = _ids(seed)
        kept = feeds["ids"].copy()
        np.testing.assert_allclose(session.run(None, feeds)[0], reference.run(None, feeds)[0],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(feeds["ids"], kept)  # the feed is only read
    wide = np.zeros(16, np.int64)
    wide[::2] = _ids(7)["ids"]  # every other element: a strided feed
    strided = {"ids": wide[::2]}
    assert not strided["ids"].flags.c_contiguous
    np.testing.assert_allclose(session.run(None, strided)[0],
                               reference.run(None, {"ids": wide[::2].copy()})[0],
                               rtol=1e-5, atol=1e-6)


def test_fixed_steps_run_as_segments_and_a_failure_names_its_node(unbound):
    """Consecutive bound steps over stable inputs run as one segment call
    (run_loop._Segment): the same bits as the kernels, and a step that fails inside one is
    named as the loop names it."""
    session = mixrt.Session(_attention_block())
    for seed in range(3):
        expected = unbound(session, _feeds(seed))
        for mine, theirs in zip(session.run(None, _feeds(seed)), expected):
            np.testing.assert_array_equal(mine, theirs)
    plan = session._last_plan[1]
    segments = [call[4][1] for arena in plan.pool for calls in arena.bound.values()
                for call in calls if call[4] is not None and call[4][0] == run_loop.SEGMENT]
    assert segments and max(len(segment.calls) for segment in segments) >= 5
    segment = max(segments, key=lambda segment: len(segment.program))
    fn, args, made, name = segment.program[1]

    def broken(*args):
        raise ValueError("a kernel's own complaint")
    segment.program = segment.program[:1] + ((broken, args, made, name),) + segment.program[2:]
    step = next(call[0] for call in segment.calls if call[4][2] == name)
    with pytest.raises(mixrt.errors.ExecutionError, match=re.escape(step.label)):
        session.run(None, _feeds(0))


def test_a_product_binds_on_a_feed_as_its_activation_only(unbound):
    """MatMul's binder reads its first input as given (``binds(feeds=(0,))``): a layer
    over the feed is bound, a product whose second input is a feed keeps its kernel, and
    both give the kernels' bits run after run, a strided feed included."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="over_the_feed"),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "v"], ["y"], name="feed_as_weight")],
        "products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [48, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [weight])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model)
    contiguous = 1 + run_loop.BIND_AT_RUN  # its runs until bound, then one bound
    for seed in range(2 * contiguous):
        feeds = {"x": rng.standard_normal((4, 32)).astype(np.float32),
                 "v": rng.standard_normal((48, 16)).astype(np.float32)}
        if seed >= contiguous:  # a strided feed: the other bound list (bound in its
            # BIND_AT_RUN-th run), the kernel's route
            wide = rng.standard_normal((4, 64)).astype(np.float32)
            feeds["x"] = wide[:, ::2]
        expected = unbound(session, feeds)
        np.testing.assert_array_equal(session.run(None, feeds)[0], expected[0])
    plan = session._last_plan[1]
    lists = {key[-1]: {call[0].label: call[4] is not None and call[4][6] is not None
                       for call in run_loop.each_call(calls)}
             for arena in plan.pool for key, calls in arena.bound.items()}
    assert lists[True]["over_the_feed"] and not lists[True]["feed_as_weight"]
    assert not lists[False]["over_the_feed"]


@pytest.mark.parametrize("inputs, outputs, rows, trans_a", [
    (24, 307, 3, 0),    # the panels (a transposed weight, PyTorch's Linear)
    (256, 256, 8, 0),   # the few-rows compiled loop
    (64, 64, 3, 0),     # the BLAS's product
    (48, 40, 1, 0),     # one row
    (32, 48, 5, 1)])    # A transposed
@pytest.mark.parametrize("fused", [False, True])
def test_a_gemm_over_the_feed_is_bound_with_the_kernels_bits(unbound, inputs, outputs, rows,
                                                             trans_a, fused):
    """Gemm's and FusedGemm's binders read A as given (``binds(feeds=(0,))``): a model's
    first Linear, over the feed, is bound in the list kept for contiguous feeds, takes
    the kernel for a strided feed, and gives the kernel's bits either way."""
    rng = np.random.default_rng(inputs + rows)
    w = numpy_helper.from_array((rng.standard_normal((outputs, inputs)) * 0.1)
                                .astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(outputs).astype(np.float32), "b")
    shape = [inputs, rows] if trans_a else [rows, inputs]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transA=trans_a, transB=1,
                              name="first_layer")]
    nodes += [helper.make_node("Relu", ["g"], ["y"])] if fused else \
        [helper.make_node("Neg", ["g"], ["y"])]
    graph = helper.make_graph(
        nodes, "first_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, outputs])], [w, b])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model)
    for seed in range(6):
        x = rng.standard_normal(shape).astype(np.float32)
        if seed >= 4:  # strided: the other list, the kernel's route
            x = np.repeat(x, 2, axis=1)[:, ::2]
        feeds = {"x": x}
        np.testing.assert_array_equal(session.run(None, feeds)[0], unbound(session, feeds)[0])
    plan = session._last_plan[1]
    lists = {key[-1]: {call[0].node.op_type: call[4] is not None and call[4][6] is not None
                       for call in run_loop.each_call(calls)}
             for arena in plan.pool for key, calls in arena.bound.items()}
    layer = "FusedGemm" if fused else "Gemm"
    assert lists[True][layer] and not lists.get(False, {}).get(layer)


@pytest.mark.parametrize("activation, attrs", [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("HardSigmoid", {}), ("Sigmoid", {}),
    ("Tanh", {}), ("HardSwish", {})])
@pytest.mark.parametrize("inputs, outputs, rows", [
    (24, 307, 1),    # one row: the BLAS's gemv, an output over 256 values
    (307, 65, 3),    # a few rows, an output under 256 values (NumPy's epilogue)
    (65, 112, 3)])   # a few rows, over 256 values (the compiled pass)
def test_a_fused_layer_s_bound_epilogue_gives_the_kernels_bits(unbound, activation, attrs,
                                                               inputs, outputs, rows):
    """FusedGemm's bias and activation under the panels' reach are bound once (NumPy's
    calls under 256 values, as the kernel makes them there; one compiled pass over more):
    every activation's bits are the unbound kernel's at each size."""
    rng = np.random.default_rng(inputs * outputs + rows)
    w = numpy_helper.from_array((rng.standard_normal((inputs, outputs)) * 0.3)
                                .astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(outputs).astype(np.float32), "b")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),  # the layer reads the arena
             helper.make_node("Gemm", ["r", "w", "b"], ["g"], name="layer"),
             helper.make_node(activation, ["g"], ["y"], **attrs)]
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, outputs])], [w, b])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model)
    for seed in range(4):
        feeds = {"x": (rng.standard_normal((rows, inputs)) * 2).astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], unbound(session, feeds)[0])
    if "FusedGemm" in {node.op_type for node in session.graph.nodes}:
        assert "FusedGemm" in _bound_ops(session)


def test_a_segment_places_a_result_that_is_not_its_view(unbound):
    """A bound call inside a segment that hands back another array than its step's view
    (as a kernel may) has it copied into the view, as the loop places it: the run's values
    stay the kernels'."""
    session = mixrt.Session(_attention_block())
    expected = unbound(session, _feeds(2))
    for _ in range(run_loop.BIND_AT_RUN):  # an arena binds its calls in its BIND_AT_RUN-th
        session.run(None, _feeds(2))
    plan = session._last_plan[1]
    segment = max((call[4][1] for arena in plan.pool for calls in arena.bound.values()
                   for call in calls if call[4] is not None and call[4][0] == run_loop.SEGMENT),
                  key=lambda segment: len(segment.program))
    position = next(i for i, (_, _, made, _) in enumerate(segment.program)
                    if isinstance(made, np.ndarray) and made.base is not None)
    fn, args, made, name = segment.program[position]

    def elsewhere(*args):
        value = np.array(fn(*args), copy=True)  # the values in an array of its own,
        made[...] = np.nan  # the view left unwritten
        return value
    segment.program = segment.program[:position] + ((elsewhere, args, made, name),) \
        + segment.program[position + 1:]
    for mine, theirs in zip(session.run(None, _feeds(2)), expected):
        np.testing.assert_array_equal(mine, theirs)


def _mlp_layer(rows=64, width=64):
    """A scikit-learn MLP's first layer as skl2onnx writes it: MatMul, Add of a (1, width)
    intercept, Relu."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["h"]),
             helper.make_node("Mul", ["h", "h"], ["y"])]
    initializers = [
        numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, width)).astype(np.float32), "b")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])], initializers)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def test_a_bound_layer_binds_its_bias_and_activation_as_one_pass(unbound, monkeypatch):
    """A fused layer's bound call makes its epilogue as the compiled pass its first call
    bound, not through ``add_and_activate_cpu``'s dispatch, with the kernel's bits."""
    from mixrt.ops.nn import bound_products
    session = mixrt.Session(_mlp_layer())
    feeds = [{"x": np.random.default_rng(seed).standard_normal((64, 64)).astype(np.float32)}
             for seed in range(4)]
    expected = [unbound(session, f)[0] for f in feeds]
    for f, theirs in zip(feeds, expected):  # the first of these binds the steps
        np.testing.assert_array_equal(session.run(None, f)[0], theirs)
    assert "FusedMatMul" in _bound_ops(session)
    dispatched = []
    real = bound_products.add_and_activate_cpu
    monkeypatch.setattr(bound_products, "add_and_activate_cpu",
                        lambda *a, **k: dispatched.append(1) or real(*a, **k))
    for f, theirs in zip(feeds, expected):
        np.testing.assert_array_equal(session.run(None, f)[0], theirs)
    assert not dispatched
