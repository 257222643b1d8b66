"""mixrt.sym: generated op functions, composition, inference, JSON, and the Executor's
forward/backward checked against NumPy, finite differences and onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mixrt
from mixrt import sym
from mixrt.base import MXNetError
from mixrt.errors import GradientError, GraphError, InputError, ModelLoadError, ShapeError
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.device import gpu_available, to_host

from helpers import central_difference


def small_net(classes: int = 3):
    """conv(2) + BN + relu + global pool + dense + softmax cross-entropy: a bit of
    everything the executor must split between forward and backward."""
    data = sym.Variable("data", shape=(None, 1, 5, 5))
    x = sym.Conv(data, sym.Variable("c_weight", shape=(2, 1, 3, 3)),
                 sym.Variable("c_bias", shape=(2,)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 name="c")
    x = sym.BatchNormalization(x, name="bn")
    x = sym.Relu(x, name="relu")
    x = sym.Flatten(sym.GlobalAveragePool(x, name="gap"), name="flat")
    logits = sym.Gemm(x, sym.Variable("fc_weight", shape=(classes, 2)),
                      sym.Variable("fc_bias", shape=(classes,)), transB=1, name="fc")
    label = sym.Variable("label", dtype="int64")
    return sym.SoftmaxCrossEntropyLoss(logits, label, name="loss")


# -- generated functions -------------------------------------------------------------------------

def test_every_registered_op_has_a_documented_function():
    namespaces = {"": sym, "ai.onnx.ml": sym.ml, "mixrt": sym.mixrt,
                  "ai.onnx.preview.training": sym.preview_training,
                  "ai.onnx.preview": sym.preview}
    for domain, op_type in REGISTRY.op_names():
        if domain not in namespaces:
            continue  # a domain some other test registered a toy op in
        function = getattr(namespaces[domain], op_type)
        assert function.__name__ == op_type
        assert f"{domain or 'ai.onnx'}::{op_type}" in function.__doc__
    assert "The convolution operator" in sym.Conv.__doc__  # the ONNX spec's summary
    assert "kernel_shape=None" in sym.Conv.__doc__
    with pytest.raises(AttributeError, match="no operator 'NoSuchOp'"):
        sym.NoSuchOp  # noqa: B018


def test_an_op_registered_later_gets_a_function():
    from mixrt.ops.ir.registry import op  # noqa: PLC0415

    @op("SymTestTwice", since=1)
    def twice(xp, X):
        return X * 2

    try:
        x = np.arange(3, dtype=np.float32)
        np.testing.assert_array_equal(sym.SymTestTwice(sym.Variable("x")).eval(x=x)[0], 2 * x)
    finally:  # leave the registry as the other tests expect it
        REGISTRY._ops.pop(("", "SymTestTwice"))
        vars(sym).pop("SymTestTwice", None)


def test_left_out_inputs_become_named_parameters_and_aux_states():
    net = sym.BatchNormalization(sym.Conv(sym.Variable("data"), kernel_shape=[3, 3],
                                          name="conv1"), name="bn1")
    assert net.list_arguments() == ["data", "conv1_weight", "bn1_gamma", "bn1_beta"]
    assert net.list_auxiliary_states() == ["bn1_moving_mean", "bn1_moving_var"]
    assert net.list_outputs() == ["bn1_output"]


def test_unknown_argument_names_the_op_and_lists_what_exists():
    with pytest.raises(GraphError, match=r"Conv 'c'.*unknown argument 'kernel'.*kernel_shape"):
        sym.Conv(sym.Variable("x"), kernel=3, name="c")
    with pytest.raises(GraphError, match="at most 3 inputs"):
        sym.Conv(*[sym.Variable(f"v{i}") for i in range(4)])


def test_prefix_applies_to_nodes_and_variables():
    with sym.prefix("block1_"):
        net = sym.Relu(sym.Add(sym.Variable("a"), sym.Variable("b"), name="add"), name="act")
    assert net.list_arguments() == ["block1_a", "block1_b"]
    assert net.name == "block1_act"


def test_nodes_sharing_a_name_stay_distinct_nodes():
    # MXNet allows two nodes of one name; the graph names the later one same_1, and
    # inference reports each by its own node
    x = sym.Variable("x")
    net = sym.Add(sym.Relu(x, name="same"), sym.Sigmoid(x, name="same"))
    graph = net.to_graph()
    assert [n.name for n in graph.nodes if n.op_type != "Add"] == ["same", "same_1"]
    values = np.array([[-1.0, 2.0]], np.float32)
    expected = np.maximum(values, 0) + 1 / (1 + np.exp(-values))
    np.testing.assert_allclose(to_host(net.eval(x=values)[0]), expected, rtol=1e-6)
    first = sym.FullyConnected(sym.Variable("data"), num_hidden=4, name="fc")
    twice = sym.FullyConnected(first, num_hidden=2, name="fc")
    args, outs, _ = twice.infer_shape(data=(3, 5))
    assert twice.list_arguments() == ["data", "fc_weight", "fc_bias", "fc_weight", "fc_bias"]
    assert args == [(3, 5), (4, 5), (4,), (2, 4), (2,)] and outs == [(3, 2)]


# -- composition, outputs, arithmetic -------------------------------------------------------------

def test_composition_replaces_variables_by_name_and_position():
    inner = sym.Relu(sym.Variable("x"), name="inner")
    outer = sym.Neg(sym.Variable("data"), name="outer")
    composed = outer(data=inner)
    assert composed.list_arguments() == ["x"]
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(composed.eval(x=x)[0], -np.maximum(x, 0))
    np.testing.assert_array_equal(outer(inner).eval(x=x)[0], -np.maximum(x, 0))
    assert outer.list_arguments() == ["data"]  # the original is unchanged
    with pytest.raises(GraphError, match="no variable 'nope'"):
        outer(nope=inner)


def test_multiple_outputs_index_group_and_internals():
    x = sym.Variable("x")
    parts = sym.Split(x, axis=0, num_outputs=3, name="split")
    assert len(parts) == 3 and parts.list_outputs() == [f"split_output{i}" for i in range(3)]
    both = sym.Group([parts[2], sym.Relu(parts["split_output0"], name="r")])
    a = np.arange(-3, 3, dtype=np.float32)
    last, first = both.eval(x=a)
    np.testing.assert_array_equal(last, a[4:])
    np.testing.assert_array_equal(first, np.maximum(a[:2], 0))
    internals = both.get_internals()
    assert "split_output1" in internals.list_outputs()
    with pytest.raises(GraphError, match="3 outputs"):
        sym.Relu(parts)
    with pytest.raises(GraphError, match="variable number of outputs"):
        sym.Split(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arithmetic_with_scalars_keeps_the_symbols_dtype(dtype):
    x, y = sym.Variable("x"), sym.Variable("y")
    net = (x * 2 + 1) / y - x ** 2 + (3 - x) @ y
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype)
    b = np.array([[2.0, 1.0], [0.5, 4.0]], dtype)
    out = net.eval(x=a, y=b)[0]
    assert out.dtype == dtype
    np.testing.assert_allclose(out, (a * 2 + 1) / b - a ** 2 + (3 - a) @ b, rtol=1e-6)
    greater = (x > 2.5).eval(x=a)[0]
    np.testing.assert_array_equal(greater, a > 2.5)


def test_scalars_are_exact_in_the_symbols_dtype_and_arrays_keep_theirs():
    """A scalar rounds once, straight to the symbol's dtype (not through float32 first);
    a Python float constant is float32, a NumPy float64 array stays float64."""
    third, big = 1.0 / 3.0, 2 ** 40 + 1
    x, n = sym.Variable("x"), sym.Variable("n", dtype="int64")
    a = np.array([1.0, 3.0])
    np.testing.assert_array_equal((x * third).eval(x=a)[0], a * third)
    np.testing.assert_array_equal((n + big).eval(n=np.array([1, 2]))[0], [big + 1, big + 2])
    assert (x * third).eval(x=a.astype(np.float32))[0].dtype == np.float32
    assert sym.constant(0.5).infer_type()[1] == [np.float32]
    assert sym.constant(np.array([third])).infer_type()[1] == [np.float64]


# -- inference -------------------------------------------------------------------------------------

def test_infer_shape_and_type():
    net = small_net()
    args, outs, aux = net.infer_shape(data=(4, 1, 5, 5), label=(4,))
    # bn's parameters were left out: their shapes follow from the data's channels
    assert dict(zip(net.list_arguments(), args)) == {
        "data": (4, 1, 5, 5), "c_weight": (2, 1, 3, 3), "c_bias": (2,), "bn_gamma": (2,),
        "bn_beta": (2,), "fc_weight": (3, 2), "fc_bias": (3,), "label": (4,)}
    assert aux == [(2,), (2,)]
    assert outs == [()]
    arg_types, out_types, _ = net.infer_type()
    assert dict(zip(net.list_arguments(), arg_types))["label"] == np.int64
    assert out_types == [np.float32]


def test_incomplete_infer_shape_warns_and_gives_nones():
    # MXNet's convention: infer_shape gives (None, None, None) and a warning naming the
    # arguments still unknown; infer_shape_partial reports them with 0 and ()
    net = sym.Gemm(sym.Variable("data"), sym.Variable("w"), transB=1)
    with pytest.warns(UserWarning, match=r"'data': \(\), 'w': \(\)"):
        assert net.infer_shape() == (None, None, None)
    args, outs, _ = net.infer_shape_partial(data=(2, 3))
    assert args == [(2, 3), ()] and outs == [()]
    args, outs, _ = (sym.Variable("x") + sym.Variable("y")).infer_shape_partial(x=(0, 3))
    assert args == [(0, 3), (0, 3)] and outs == [(0, 3)]
    assert net.infer_shape(data=(2, 3), w=(5, 3))[1] == [(2, 5)]
    with pytest.raises(GraphError, match="no variables"):
        net.infer_shape(nothing=(1,))


def test_contradictory_shapes_still_raise():
    net = sym.FullyConnected(sym.Variable("data"), num_hidden=4, name="fc")
    with pytest.raises(ShapeError, match="fc_weight"):
        net.infer_shape(data=(2, 3), fc_weight=(5, 3))
    with pytest.raises(MXNetError, match="fc_weight"):
        net.infer_shape_partial(data=(2, 3), fc_weight=(4, 7))
    gemm = sym.Gemm(sym.Variable("d"), sym.Variable("w"), transB=1)
    with pytest.raises(ShapeError, match="gemm"):
        gemm.infer_shape(d=(2, 3), w=(5, 4))


def test_simple_bind_names_the_arguments_it_cannot_shape():
    net = sym.Gemm(sym.Variable("data"), sym.Variable("w"), transB=1)
    with pytest.raises(ShapeError, match=r"simple_bind.*'w': \(\)"):
        net.simple_bind(data=(2, 3))
    with pytest.raises(ShapeError, match=r"'data': \(0, 3\)"):
        (sym.Variable("data") * 2).simple_bind(data=(0, 3))


def test_infer_type_partial_leaves_undecided_dtypes_none():
    data = sym.Variable("data")
    net = sym.FullyConnected(sym.Cast(data, dtype="float32"), num_hidden=4, name="fc")
    args, outs, aux = net.infer_type_partial()
    assert args == [None, np.float32, np.float32] and outs == [np.float32] and aux == []
    assert net.infer_type_partial(data="float16")[0][0] == np.float16
    assert sym.sin(sym.Variable("x")).infer_type_partial() == ([None], [None], [])


# -- JSON ------------------------------------------------------------------------------------------

def test_json_round_trip_keeps_structure_and_results(tmp_path):
    net = sym.Reshape(small_net().get_internals()["fc_output"], [-1], name="flat_logits") + 0.5
    path = tmp_path / "net.json"
    net.save(path)
    loaded = sym.load(path)
    assert loaded.list_arguments() == net.list_arguments()
    assert loaded.list_auxiliary_states() == net.list_auxiliary_states()
    assert loaded.tojson() == net.tojson()
    rng = np.random.default_rng(0)
    args, _, aux = net.infer_shape(data=(2, 1, 5, 5))
    values = {n: rng.standard_normal(s).astype(np.float32)
              for n, s in zip(net.list_arguments(), args)}
    values.update({n: np.abs(rng.standard_normal(s)).astype(np.float32) + 0.5
                   for n, s in zip(net.list_auxiliary_states(), aux)})
    np.testing.assert_array_equal(net.eval(**values)[0], loaded.eval(**values)[0])


def _corrupt(document, how):
    nodes = document["nodes"]
    if how == "reference":
        nodes[-1]["inputs"][0] = [len(nodes) + 3, 0]
    elif how == "output index":
        nodes[-1]["inputs"][0] = [0, 7]
    elif how == "operator":
        nodes[-1]["op"] = "NoSuchOp"
    elif how == "tensor":
        constant = next(n for n in nodes if n["op"] == "")
        constant["info"]["value"]["__tensor__"]["shape"] = [1000]
    elif how == "heads":
        document["heads"] = []
    elif how == "format":
        document["format"] = "something else"
    return document


@pytest.mark.parametrize("how, message", [
    ("reference", "only nodes 0"), ("output index", "output 7"), ("operator", "NoSuchOp"),
    ("tensor", "needs 8000 bytes"), ("heads", "no outputs"), ("format", "not a mixrt symbol"),
])
def test_json_loader_rejects_damaged_files(how, message):
    net = sym.Relu(sym.Variable("x") + 1.0, name="r")
    document = _corrupt(json.loads(net.tojson()), how)
    with pytest.raises(ModelLoadError, match=message):
        sym.load_json(json.dumps(document))
    with pytest.raises(ModelLoadError, match="not symbol JSON"):
        sym.load_json("{not json")


# -- the executor ------------------------------------------------------------------------------------

def _bound_small_net(dtype=np.float64, batch: int = 4, ctx="cpu"):
    mixrt.random.seed(3)
    net = small_net()
    dtypes = {n: dtype for n in net.list_arguments() if n != "label"}
    dtypes["label"] = np.int64
    executor = net.simple_bind(ctx, type_dict=dtypes, data=(batch, 1, 5, 5), label=(batch,))
    executor.init_params(mixrt.initializer.Normal(0.5))
    executor.copy_params_from({name: np.random.default_rng(1).uniform(0.5, 1.5, 2)
                               for name in ("bn_gamma", "bn_beta")})
    rng = np.random.default_rng(0)
    feeds = {"data": rng.standard_normal((batch, 1, 5, 5)).astype(dtype),
             "label": rng.integers(0, 3, batch)}
    return executor, feeds


def test_backward_matches_finite_differences():
    executor, feeds = _bound_small_net()
    loss = executor.forward(is_train=True, **feeds)[0]
    executor.backward()
    assert executor.data_names == ["data", "label"]
    # MXNet's simple_bind: a plain grad_req covers the data too; the int64 label has none
    assert set(executor.grad_dict) == {"data", "c_weight", "c_bias", "bn_gamma", "bn_beta",
                                       "fc_weight", "fc_bias"}
    for name, grad in executor.grad_dict.items():
        if name in executor.data_names:  # fed anew each forward: not perturbed here
            continue
        array = executor.arg_dict[name]
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            numeric[index] = central_difference(executor, feeds, array, index)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8, err_msg=name)
    assert np.isfinite(loss)


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_on_the_gpu_the_executor_matches_the_cpu_and_keeps_its_arrays_there():
    """Bound to mixrt.gpu(0), outputs, gradients and running statistics are device arrays
    (as the bound ones are) and equal the CPU executor's, in float64."""
    cpu, feeds = _bound_small_net()
    gpu, _ = _bound_small_net(ctx=mixrt.gpu(0))
    device_array = type(gpu.arg_dict["data"])
    assert device_array is not np.ndarray
    results = {}
    for name, executor in (("cpu", cpu), ("gpu", gpu)):
        train_loss = executor.forward(is_train=True, **feeds)
        executor.backward()
        infer_loss = executor.forward(is_train=False, **feeds)
        arrays = {"train loss": train_loss[0], "predict loss": infer_loss[0],
                  **executor.grad_dict, **executor.aux_dict}
        if name == "gpu":
            assert all(type(a) is device_array for a in arrays.values())
        results[name] = {k: to_host(a) for k, a in arrays.items()}
    for key, expected in results["cpu"].items():
        np.testing.assert_allclose(results["gpu"][key], expected, rtol=1e-9, atol=1e-12,
                                   err_msg=key)


def test_training_forward_updates_running_statistics_and_inference_uses_them():
    executor, feeds = _bound_small_net(np.float32)
    before = {n: a.copy() for n, a in executor.aux_dict.items()}
    train_loss = executor.forward(is_train=True, **feeds)[0].asnumpy()
    mean = executor.aux_dict["bn_moving_mean"]
    assert not np.allclose(mean, before["bn_moving_mean"])
    conv = sym.Group([small_net().get_internals()["c_output"]])
    activations = conv.eval(**{n: executor.arg_dict[n] for n in conv.list_arguments()})[0]
    expected = 0.9 * before["bn_moving_mean"] + 0.1 * activations.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(mean, expected, rtol=1e-5, atol=1e-6)
    infer_loss = executor.forward(is_train=False, **feeds)[0]
    assert not np.isclose(train_loss, infer_loss)  # running, not batch, statistics


def test_head_gradients_weight_the_outputs():
    x, w = sym.Variable("x"), sym.Variable("w")
    net = sym.Group([x * w, sym.ReduceSum(w, keepdims=0, name="total")])
    a = np.array([1.0, 2.0, 3.0], np.float32)
    executor = net.bind("cpu", args={"x": a, "w": np.ones(3, np.float32)},
                        grad_req={"w": "write"})
    executor.forward(is_train=True)
    head = np.array([0.5, -1.0, 2.0], np.float32)
    executor.backward([head, np.float32(3.0)])
    np.testing.assert_allclose(executor.grad_dict["w"], head * a + 3.0)
    assert "x" not in executor.grad_dict
    with pytest.raises(InputError, match="has shape"):
        executor.backward([np.ones(2, np.float32), np.float32(1)])
    with pytest.raises(InputError, match="2 outputs"):
        executor.backward([head])


def test_grad_req_add_accumulates():
    x = sym.Variable("x")
    executor = (x * x).bind("cpu", args={"x": np.array([1.0, 2.0], np.float32)},
                            grad_req="add")
    for _ in range(3):
        executor.forward(is_train=True)
        executor.backward()
    np.testing.assert_allclose(executor.grad_dict["x"], 3 * 2 * np.array([1.0, 2.0]))


def test_block_grad_stops_the_gradient():
    x, w = sym.Variable("x"), sym.Variable("w")
    net = sym.Group([w * w, sym.mixrt.BlockGrad(x * w)])
    executor = net.bind("cpu", args={"x": np.float32([2.0]), "w": np.float32([3.0])},
                        grad_req={"w": "write"})
    outputs = executor.forward(is_train=True)
    np.testing.assert_allclose(outputs[1], [6.0])
    executor.backward()
    np.testing.assert_allclose(executor.grad_dict["w"], [6.0])  # only d(w*w)/dw


def test_executor_errors_name_what_is_wrong():
    x = sym.Variable("x")
    net = sym.Relu(x)
    with pytest.raises(InputError, match=r"lacks arrays for \['x'\]"):
        net.bind("cpu", args={})
    with pytest.raises(InputError, match="grad_req"):
        net.bind("cpu", args={"x": np.ones(2, np.float32)}, grad_req="sometimes")
    executor = net.bind("cpu", args={"x": np.ones(2, np.float32)})
    with pytest.raises(GradientError, match="forward"):
        executor.backward()
    with pytest.raises(InputError, match="no argument 'y'"):
        executor.forward(y=np.ones(2))


def test_new_batch_size_rebinds_the_data():
    executor, feeds = _bound_small_net(np.float32, batch=4)
    executor.forward(is_train=True, **feeds)
    executor.backward()
    small = {"data": feeds["data"][:2], "label": feeds["label"][:2]}
    loss = executor.forward(is_train=True, **small)[0]
    executor.backward()
    assert executor.arg_dict["data"].shape == (2, 1, 5, 5) and np.isfinite(loss)


def test_exported_model_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    executor, feeds = _bound_small_net(np.float32)
    executor.forward(is_train=True, **feeds)  # running statistics move off their defaults
    path = tmp_path / "small.onnx"
    executor.export_onnx(path, data_names=["data"], outputs=["fc_output"])
    reference = ort.InferenceSession(str(path)).run(None, {"data": feeds["data"]})[0]
    internals = small_net().get_internals()["fc_output"]
    ours = internals.bind("cpu", args={n: executor.arg_dict[n] for n in
                                       internals.list_arguments()},
                          aux_states=executor.aux_dict, grad_req="null").forward()[0]
    np.testing.assert_allclose(reference, ours, rtol=1e-5, atol=1e-6)
