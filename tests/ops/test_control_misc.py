"""Control flow, sequences, strings, ai.onnx.ml and training kernels: cases the ONNX node tests
miss, checked against onnxruntime where it implements the op, else against hand values."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import mixrt
from mixrt.ops.control import control, sequence
from mixrt.ops.ml import forest, ml
from mixrt.ops.training import training

ML = "ai.onnx.ml"
RNG = np.random.default_rng(0)


def _model(nodes, inputs, n_outputs, opsets, outputs=None):
    graph_inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        for name, value in inputs]
    outputs = outputs or [f"y{i}" for i in range(n_outputs)]
    graph = helper.make_graph(nodes, "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(n) for n in outputs])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid(domain, version) for domain, version in opsets.items()])


def run_both(op_type, inputs, *, domain="", opset=21, n_outputs=1, exact=True, **attrs):
    """One node on mixrt and onnxruntime; ``inputs`` is a list of (name, array)."""
    node = helper.make_node(op_type, [n for n, _ in inputs],
                            [f"y{i}" for i in range(n_outputs)], domain=domain, **attrs)
    opsets = {"": 21, domain: opset} if domain else {"": opset}
    model = _model([node], inputs, n_outputs, opsets)
    feeds = dict(inputs)
    ours = mixrt.Session(model).run(None, feeds)
    reference = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(ours, reference):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        if exact or got.dtype == object:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return ours


class FakeBody:
    """A Subgraph stand-in: a Python function with the body's input and output names."""

    def __init__(self, fn, n_in, n_out, output_types=None):
        self.fn, self.input_names = fn, [f"i{k}" for k in range(n_in)]
        self.output_names = [f"o{k}" for k in range(n_out)]
        if output_types is not None:
            self.output_types = output_types

    def __call__(self, *values):
        return list(self.fn(*values))


# -- control flow -----------------------------------------------------------------------

def test_loop_stops_on_cond_and_stacks_scan_outputs():
    body = FakeBody(lambda i, cond, acc: (np.asarray(i < 2), acc + i, acc * 2), 3, 3)
    final, scanned = control.loop(np, np.asarray(10), np.asarray(True), np.asarray(1), body=body)
    assert final == 1 + 0 + 1 + 2
    np.testing.assert_array_equal(scanned, [2, 2, 4])


def test_loop_with_zero_trips_uses_declared_scan_type():
    from mixrt.ops.ir.types import tensor
    body = FakeBody(lambda i, c, x: (c, x, x), 3, 3,
                    output_types=[tensor(bool, ()), tensor(np.int32, (2,)), tensor(np.int32, (2,))])
    final, scanned = control.loop(np, np.asarray(0), None, np.ones(2, np.int32), body=body)
    assert scanned.shape == (0, 2) and scanned.dtype == np.int32
    np.testing.assert_array_equal(final, [1, 1])


def test_loop_without_cond_still_stops_on_the_body_condition():
    """The spec's comments say the body's condition is ignored here; onnxruntime stops on
    it (one iteration, not four), and users compare against onnxruntime."""
    body = FakeBody(lambda i, c, x: (np.asarray(False), x + 1), 3, 2)
    (final,) = control.loop(np, np.asarray(4), None, np.asarray(0), body=body)
    assert final == 1


def test_scan9_reverse_input_and_output_axis():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)  # scanned along axis 1
    body = FakeBody(lambda s, col: (s + col, s + col), 2, 2)
    state, out = control.scan(np, np.zeros(3, np.float32), x, body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_input_directions=[1],
                              scan_output_axes=[-1], scan_output_directions=[1])
    np.testing.assert_array_equal(state, x.sum(axis=1))
    # running sums from the back, stored back to front along the last axis
    np.testing.assert_array_equal(out, np.stack([x[:, 1] + x[:, 0], x[:, 1]], axis=-1))


def test_scan8_sequence_lens_pads_outputs():
    x = np.arange(8, dtype=np.float32).reshape(2, 4, 1)
    body = FakeBody(lambda s, v: (s + v, s + v), 2, 2)
    state, out = control.scan_8(np, np.array([2, 4], np.int64), np.zeros((2, 1), np.float32),
                                x, body=body, num_scan_inputs=1)
    np.testing.assert_array_equal(state, [[1], [4 + 5 + 6 + 7]])
    np.testing.assert_array_equal(out[0, :, 0], [0, 1, 0, 0])
    np.testing.assert_array_equal(out[1, :, 0], [4, 9, 15, 22])


def test_if_infer_merges_branch_shapes():
    from mixrt.ops.ir.types import tensor
    then_b = FakeBody(None, 0, 1, output_types=[tensor(np.float32, (2, 3))])
    else_b = FakeBody(None, 0, 1, output_types=[tensor(np.float32, (2, 4))])
    (merged,) = control.if_.kernels[0].infer_fn(tensor(bool, ()), then_branch=then_b,
                                                else_branch=else_b)
    assert merged.shape == (2, None) and merged.dtype == np.float32


# -- sequences --------------------------------------------------------------------------

def test_split_to_sequence_scalar_split_leaves_short_tail():
    (pieces,) = sequence.split_to_sequence(np, np.arange(7), np.asarray(3))
    assert [p.tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]]


def test_sequence_positions_and_erase_default():
    seq = [np.asarray(i) for i in range(4)]
    assert sequence.sequence_at(np, seq, np.asarray(-1)) == 3
    (erased,) = sequence.sequence_erase(np, seq)
    assert len(erased) == 3 and len(seq) == 4  # the input list is not mutated
    (inserted,) = sequence.sequence_insert(np, seq, np.asarray(9), np.asarray(-4))
    assert inserted[0] == 9
    with pytest.raises(IndexError):
        sequence.sequence_at(np, seq, np.asarray(4))


def test_concat_from_sequence_new_axis_negative():
    seq = [np.ones((2, 3)), np.zeros((2, 3))]
    out = sequence.concat_from_sequence(np, seq, axis=-1, new_axis=1)
    assert out.shape == (2, 3, 2)


# -- strings ----------------------------------------------------------------------------

def test_string_split_maxsplit_with_whitespace():
    x = np.array(["  a b  c ", ""], dtype=object)
    run_both("StringSplit", [("x", x)], n_outputs=2, maxsplit=1)


@pytest.mark.parametrize("mode", ["IDF", "TFIDF"])
def test_tfidf_weighted_modes_strings(mode):
    x = np.array([["a", "b", "a", "c"], ["b", "b", "c", "a"]], dtype=object)
    run_both("TfIdfVectorizer", [("x", x)], opset=9, exact=False, mode=mode, min_gram_length=1,
             max_gram_length=2, max_skip_count=1, ngram_counts=[0, 3],
             ngram_indexes=[0, 1, 2, 3, 4], pool_strings=["a", "b", "c", "a", "b", "b", "c"],
             weights=[0.5, 2.0, 1.0, 3.0, 0.25])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("pool", ["strings", "int64s"])
def test_tfidf_single_items_counted_by_dict_match_onnxruntime(mode, pool):
    """Unigram pools (scikit-learn's default) take the dict count: repeats, items outside
    the pool, an empty row, a pool entry's column out of order."""
    words = [["b", "zz", "b", "a"], ["c", "c", "c", "#"], ["#", "#", "#", "#"]]
    vocabulary = ["a", "b", "c", "d"]
    if pool == "strings":
        x = np.array(words, dtype=object)
        table = dict(pool_strings=vocabulary)
    else:
        codes = {w: i + 10 for i, w in enumerate(vocabulary + ["zz", "#"])}
        x = np.array([[codes[w] for w in row] for row in words], dtype=np.int64)
        table = dict(pool_int64s=[codes[w] for w in vocabulary])
    run_both("TfIdfVectorizer", [("x", x)], opset=9, exact=False, mode=mode, min_gram_length=1,
             max_gram_length=1, max_skip_count=0, ngram_counts=[0],
             ngram_indexes=[3, 0, 1, 4], weights=[0.5, 2.0, 1.5, 3.0], **table)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_rows_finding_few_and_many_items_weigh_alike(mode):
    """A row finding at most SCALAR_WRITES pool entries writes them one by one as Python
    floats, a row finding more through NumPy's float32 products: the same bits either way,
    and onnxruntime's."""
    from mixrt.ops.text.string import SCALAR_WRITES
    vocabulary = [f"w{i}" for i in range(2 * SCALAR_WRITES)]
    weights = np.random.default_rng(3).uniform(0.1, 7.0, len(vocabulary)).astype(np.float32)
    many = vocabulary + vocabulary[:5]  # every entry, five of them twice
    few = (vocabulary[:3] * 3 + ["unknown"] * len(vocabulary))[:len(many)]
    x = np.array([many, few], dtype=object)
    run_both("TfIdfVectorizer", [("x", x)], opset=9, mode=mode, min_gram_length=1,
             max_gram_length=1, max_skip_count=0, ngram_counts=[0],
             ngram_indexes=list(range(len(vocabulary)))[::-1], pool_strings=vocabulary,
             weights=weights.tolist())


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("pool", ["strings", "int64s"])
def test_tfidf_many_documents_counted_at_once_give_each_rows_bits(monkeypatch, mode, pool):
    """From ARRAY_ROWS documents the single items of every row are counted in one pass: the
    bits of counting row by row (a negative weight's -0.0 included) and onnxruntime's."""
    from mixrt.ops.text import string
    rng = np.random.default_rng(7)
    vocabulary = [f"w{i}" for i in range(12)]
    words = rng.choice(vocabulary + ["zz", "#"], size=(string.ARRAY_ROWS + 5, 9))
    weights = rng.uniform(-2.0, 7.0, len(vocabulary)).astype(np.float32)
    if pool == "strings":
        x = words.astype(object)
        table = dict(pool_strings=vocabulary)
    else:
        codes = {w: i + 10 for i, w in enumerate(vocabulary + ["zz", "#"])}
        x = np.vectorize(codes.get)(words).astype(np.int64)
        table = dict(pool_int64s=[codes[w] for w in vocabulary])
    attributes = dict(mode=mode, min_gram_length=1, max_gram_length=1, max_skip_count=0,
                      ngram_counts=[0], ngram_indexes=list(range(len(vocabulary)))[::-1],
                      weights=weights.tolist(), **table)
    at_once = string.tfidf_vectorizer(np, x, **attributes, _node={})
    monkeypatch.setattr(string, "ARRAY_ROWS", 10 ** 9)
    by_row = string.tfidf_vectorizer(np, x, **attributes, _node={})
    np.testing.assert_array_equal(at_once, by_row)
    assert not (np.signbit(at_once) & (at_once == 0)).any()  # no -0.0: zeros read 0.0
    run_both("TfIdfVectorizer", [("x", x)], opset=9, **attributes)


# -- ai.onnx.ml -------------------------------------------------------------------------

def test_label_encoder_float_keys_nan_and_repeats():
    x = np.array([1.5, np.nan, 2.0, 7.0], dtype=np.float32)
    (y,) = [ml.label_encoder_2(np, x, keys_floats=[1.5, float("nan"), 2.0, 1.5],
                               values_int64s=[1, 2, 3, 4], default_int64=-7)]
    np.testing.assert_array_equal(y, [4, 2, 3, -7])  # the last repeated key wins


def test_label_encoder_1_maps_both_ways():
    classes = ["x", "y", "z"]
    np.testing.assert_array_equal(
        ml.label_encoder_1(np, np.array(["z", "q"], dtype=object), classes_strings=classes),
        [2, -1])
    out = ml.label_encoder_1(np, np.array([1, 5], np.int64), classes_strings=classes,
                             default_string="?")
    assert out.tolist() == ["y", "?"]


def _tree_attrs(post_transform, aggregate):
    # two trees over 2 features, 2 targets
    return dict(
        n_targets=2, aggregate_function=aggregate, post_transform=post_transform,
        tree_roots=[0, 2],
        nodes_modes=numpy_helper.from_array(np.array([0, 3, 4], np.uint8), "m"),
        nodes_featureids=[0, 1, 1],
        nodes_splits=numpy_helper.from_array(np.array([0.0, 0.5, 1.0], np.float32), "s"),
        nodes_truenodeids=[0, 2, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 1, 4], nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[1, 0, 0],
        leaf_targetids=[0, 1, 0, 1, 0],
        leaf_weights=numpy_helper.from_array(
            np.array([1.0, -2.0, 3.0, 0.5, -1.0], np.float32), "w"))


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_against_onnxruntime(aggregate):
    x = RNG.standard_normal((16, 2)).astype(np.float32)
    x[::5, 0] = np.nan
    x[3, 1] = 1.0
    run_both("TreeEnsemble", [("x", x)], domain=ML, opset=5, exact=False,
             **_tree_attrs(0, aggregate))


def test_tree_ensemble_post_transform_codes_follow_the_spec():
    """SOFTMAX is 1 and LOGISTIC 2 in the spec and onnx's reference; onnxruntime swaps them,
    so these are checked by hand."""
    x = np.array([[-1.0, 0.0]], np.float32)  # tree 1 -> leaf 0 (t0: 1), tree 2 -> leaf 4
    raw = forest.tree_ensemble(np, x, **_tree_attrs_arrays(0))
    np.testing.assert_allclose(raw, [[0.0, 0.0]])
    x = np.array([[1.0, 0.0]], np.float32)  # tree 1 -> leaf 1 (t1: -2), tree 2 -> leaf 4 (t0: -1)
    raw = forest.tree_ensemble(np, x, **_tree_attrs_arrays(0))
    np.testing.assert_allclose(raw, [[-1.0, -2.0]])
    softmax = forest.tree_ensemble(np, x, **_tree_attrs_arrays(1))
    np.testing.assert_allclose(softmax, [[1 / (1 + np.exp(-1)), 1 / (1 + np.exp(1))]], rtol=1e-6)
    logistic = forest.tree_ensemble(np, x, **_tree_attrs_arrays(2))
    np.testing.assert_allclose(logistic, 1 / (1 + np.exp([[1.0, 2.0]])), rtol=1e-6)


def test_softmax_zero_keeps_zeros():
    scores = np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    out = ml.post_transform_scores(np, scores, "SOFTMAX_ZERO")
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(out, [[0, e[0] / e.sum(), e[1] / e.sum()], [0.5, 0.5, 0.5]])


def _tree_attrs_arrays(post_transform):
    attrs = _tree_attrs(post_transform, 1)
    return {k: numpy_helper.to_array(v) if hasattr(v, "data_type") else v
            for k, v in attrs.items()}


@pytest.mark.parametrize("op_type, attrs, x", [
    ("Normalizer", dict(norm="L2"), RNG.standard_normal((3, 4)).astype(np.float32)),
    ("Normalizer", dict(norm="L1"), RNG.standard_normal((3, 4))),
    ("Scaler", dict(offset=[0.5, 0.0, -1.0], scale=[2.0, 1.0, 0.5]), RNG.standard_normal((2, 3))),
    ("OneHotEncoder", dict(cats_int64s=[3, 1, 7]), np.array([[1, 7], [3, 2]], np.int64)),
    ("OneHotEncoder", dict(cats_strings=["a", "b"]), np.array(["b", "a", "c"], dtype=object)),
    ("Imputer", dict(imputed_value_floats=[9.0, 8.0], replaced_value_float=float("nan")),
     np.array([[np.nan, 1.0], [2.0, np.nan]], np.float32)),
    ("LinearRegressor", dict(coefficients=[1.0, 2.0, -1.0, 0.5], intercepts=[0.5, 1.0],
                             targets=2), RNG.standard_normal((4, 2)).astype(np.float32)),
    ("Binarizer", dict(threshold=0.25), RNG.standard_normal((3, 3)).astype(np.float32)),
])
def test_ml_transforms_against_onnxruntime(op_type, attrs, x):
    run_both(op_type, [("x", x)], domain=ML, opset=1, exact=False, **attrs)


def test_array_feature_extractor_1d():
    out = ml.array_feature_extractor(np, np.arange(5.0), np.array([4, 0]))
    assert out.shape == (1, 2) and out.tolist() == [[4.0, 0.0]]


def test_feature_vectorizer_pads_and_truncates():
    out = ml.feature_vectorizer(np, np.ones((2, 3), np.int64), np.full((2, 1), 2.0),
                                inputdimensions=[2, 3])
    np.testing.assert_array_equal(out, [[1, 1, 2, 0, 0]] * 2)
    assert out.dtype == np.float32


# -- training ---------------------------------------------------------------------------

def test_adam_first_step_and_dtype():
    x, g = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    zeros = np.zeros(3, np.float32)
    x0, v0, h0 = training.adam(np, np.asarray(0.1, np.float32), np.asarray(0), x, g, zeros,
                               zeros)
    assert x0.dtype == v0.dtype == h0.dtype == np.float32
    # T == 0: no bias correction, so the step is R * v / (sqrt(h) + eps)
    np.testing.assert_allclose(x0, 1 - 0.1 * 0.05 / (np.sqrt(0.00025) + 1e-6), rtol=1e-6)


def test_momentum_rejects_unknown_mode():
    with pytest.raises(ValueError, match="nesterov"):
        training.momentum(np, np.asarray(0.1), np.asarray(0), np.ones(1), np.ones(1),
                          np.ones(1), alpha=0.9, beta=0.1, mode="heavy", norm_coefficient=0.0)


def _random_forest(rng, n_trees=3, depth=3, n_features=3, n_targets=2):
    """Random complete trees in the (tree id, node id) encoding of TreeEnsembleRegressor."""
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids",
                             "nodes_modes", "nodes_values", "nodes_truenodeids",
                             "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                             "target_treeids", "target_nodeids", "target_ids",
                             "target_weights")}
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"]
    for tree in range(n_trees):
        n_interior = 2 ** depth - 1
        for node in range(2 ** (depth + 1) - 1):
            interior = node < n_interior
            attrs["nodes_treeids"].append(tree)
            attrs["nodes_nodeids"].append(node)
            attrs["nodes_featureids"].append(int(rng.integers(n_features)) if interior else 0)
            attrs["nodes_modes"].append(str(rng.choice(modes)) if interior else "LEAF")
            attrs["nodes_values"].append(float(rng.standard_normal()) if interior else 0.0)
            attrs["nodes_truenodeids"].append(2 * node + 1 if interior else 0)
            attrs["nodes_falsenodeids"].append(2 * node + 2 if interior else 0)
            attrs["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
            if not interior:
                for target in range(n_targets):
                    if rng.random() < 0.7:
                        attrs["target_treeids"].append(tree)
                        attrs["target_nodeids"].append(node)
                        attrs["target_ids"].append(target)
                        attrs["target_weights"].append(float(rng.standard_normal()))
    return attrs


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_tree_ensemble_regressor_against_onnxruntime(aggregate, post_transform):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 3)).astype(np.float32)
    x[::7, 1] = np.nan
    run_both("TreeEnsembleRegressor", [("x", x)], domain=ML, opset=3, exact=False,
             n_targets=2, aggregate_function=aggregate, post_transform=post_transform,
             base_values=[0.25, -0.5], **_random_forest(rng))


@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("coefficients, intercepts, labels", [
    ([0.5, -0.25], [0.1], dict(classlabels_ints=[3, 7])),            # binary, one score
    ([0.5, -0.25, -0.5, 0.3], [0.1, 0.2], dict(classlabels_strings=["a", "b"])),
    ([0.5, -0.25, -0.5, 0.3, 1, 1], [0.1, 0.2, -3], dict(classlabels_ints=[3, 7, 9])),
])
def test_linear_classifier_against_onnxruntime(post_transform, coefficients, intercepts, labels):
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, 0.0], [3.0, -2.0]], np.float32)
    run_both("LinearClassifier", [("x", x)], domain=ML, opset=1, n_outputs=2, exact=False,
             coefficients=coefficients, intercepts=intercepts, post_transform=post_transform,
             **labels)


@pytest.mark.parametrize("x", [np.array([["b", "zz"], ["a", "c"]], dtype=object),
                               np.array([5, 9, 1], np.int64)])
def test_category_mapper_against_onnxruntime(x):
    run_both("CategoryMapper", [("x", x)], domain=ML, opset=1, cats_strings=["a", "b", "c"],
             cats_int64s=[1, 5, 7], default_int64=-3, default_string="none")
