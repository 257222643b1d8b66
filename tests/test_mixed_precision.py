"""Mixed-precision training: the float16 graph rewrite, the loss scaler, TrainingProgram and
Module.fit with precision=, on the CPU (and on a GPU where CuPy has one)."""

import numpy as np
import pytest
from helpers import flat_digits, mlp_graph

from mixrt import random as mixrt_random
from mixrt.errors import InputError, UnsupportedOperatorError
from mixrt.gluon import Trainer
from mixrt.io import NDArrayIter
from mixrt.models.digits import digits_cnn
from mixrt.module import Module
from mixrt.ops.device import gpu_available
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.training.mixed_precision import (FLOAT32_OPS, LossScaler, lower_precision,
                                                    parse_precision)
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.training.program import TrainingProgram, softmax_cross_entropy

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def mlp(inputs=64, hidden=64, outputs=10, seed=0) -> Graph:
    return mlp_graph(inputs, hidden, outputs, seed,
                     scales=(np.sqrt(2 / inputs), np.sqrt(1 / hidden)))


@pytest.fixture(scope="module")
def digits():
    return flat_digits()


def _fit(precision, digits, epochs=5, **options):
    xt, yt, xe, ye = digits
    mixrt_random.seed(1)
    model = Module(mlp())
    history = model.fit(NDArrayIter(xt, yt, 64, shuffle=True, seed=2),
                        eval_data=NDArrayIter(xe, ye, 128), optimizer="sgd",
                        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
                        epochs=epochs, progress=False, precision=precision, **options)
    return model, history


def _types_by_op(graph: Graph, feeds: dict) -> dict:
    """op type -> the set of dtypes its nodes' first outputs have, for these feed shapes."""
    shaped = Graph(graph.name, [Value(v.name, TensorType(np.asarray(feeds[v.name]).dtype,
                                                         np.shape(feeds[v.name])))
                                if v.name in feeds else v for v in graph.inputs],
                   graph.outputs, graph.nodes, graph.initializers, opsets=graph.opsets)
    types = infer_types(shaped)
    found: dict[str, set] = {}
    for node in graph.nodes:
        found.setdefault(node.op_type, set()).add(np.dtype(types[node.outputs[0]].dtype))
    return found


# -- training ---------------------------------------------------------------------------------

def test_float16_training_reaches_float32_accuracy(digits):
    _, full = _fit("float32", digits)
    model, half = _fit("float16", digits)
    assert half[-1]["eval_accuracy"] >= 0.93
    assert half[-1]["eval_accuracy"] >= full[-1]["eval_accuracy"] - 0.02
    assert half[-1]["loss"] == pytest.approx(full[-1]["loss"], rel=0.1)
    assert model.loss_scaler.scale == 2.0 ** 16 and model.loss_scaler.skipped_steps == 0


def test_bfloat16_training_on_the_cpu_reaches_float32_accuracy(digits):
    """bfloat16 needs no loss scaling (float32's range) and trains through ml_dtypes."""
    _, full = _fit("float32", digits)
    model, brain = _fit("bfloat16", digits)
    assert brain[-1]["eval_accuracy"] >= full[-1]["eval_accuracy"] - 0.03
    assert model.loss_scaler is None


def test_joint_graph_computes_in_float16():
    graph, x = mlp(), np.ones((8, 64), F32)
    graph.value_types["h"] = TensorType(F32, ("N", 64))  # value_info an importer keeps
    program = TrainingProgram(graph, softmax_cross_entropy("out"), ["w1", "b1", "w2", "b2"],
                              precision="float16")
    feeds = program._feeds(graph.initializers, {"x": x, "label": np.zeros(8, np.int64)})
    for executed in (program.joint.graph, program.session.graph):  # before and after passes
        found = _types_by_op(executed, feeds)
        assert found["Gemm"] == {F16} and found["Relu"] == {F16}
        assert found["ReluGrad"] == {F16}
        assert found["SoftmaxCrossEntropyLoss"] == {F32}  # the loss is on the deny list
    types = infer_types(program.joint.graph)
    assert {np.dtype(types[name].dtype) for name in program._grad_names} == {F32}
    assert all(v.type.dtype == F32 for v in program.joint.graph.inputs
               if v.name in program.trainable)


def test_gradients_master_weights_and_optimizer_state_stay_float32(digits):
    xt, yt, _, _ = digits
    model = Module(mlp())
    trainer = Trainer(model.params.trainable(), "adam", {"learning_rate": 1e-3})
    model.train_step(xt[:32], yt[:32], trainer, precision="float16")
    for name, param in model.params.items():
        assert param.data().dtype == F32 and param.grad().dtype == F32, name
    state = trainer.optimizer.state_dict()
    assert {v.dtype for k, v in state.items() if k != "meta"} == {F32}


def test_unscaled_float16_gradients_match_float32():
    rng = np.random.default_rng(4)
    graph = mlp()
    feeds = {"x": rng.standard_normal((16, 64)).astype(F32),
             "label": rng.integers(0, 10, 16)}
    trainable = ["w1", "b1", "w2", "b2"]
    full = TrainingProgram(graph, softmax_cross_entropy("out"), trainable)
    half = TrainingProgram(graph, softmax_cross_entropy("out"), trainable,
                           precision="float16")
    loss32, (out32,), grads32 = full.step(graph.initializers, feeds)
    loss16, (out16,), grads16 = half.step(graph.initializers, feeds)
    assert out16.dtype == F32 and loss16 == pytest.approx(loss32, rel=2e-3)
    for name in trainable:
        scale = np.abs(grads32[name]).max()
        np.testing.assert_allclose(grads16[name], grads32[name], atol=3e-3 * scale)


def test_convolutions_train_in_float16():
    mixrt_random.seed(0)
    graph = digits_cnn(channels=(4, 8), hidden=16)
    trainable = list(graph.initializers)
    rng = np.random.default_rng(0)
    feeds = {"image": rng.uniform(0, 1, (16, 1, 8, 8)).astype(F32),
             "label": rng.integers(0, 10, 16)}
    full = TrainingProgram(graph, softmax_cross_entropy("logits"), trainable)
    half = TrainingProgram(graph, softmax_cross_entropy("logits"), trainable,
                           precision="float16")
    _, _, grads32 = full.step(graph.initializers, feeds)
    _, _, grads16 = half.step(graph.initializers, feeds)
    found = _types_by_op(half.joint.graph, half._feeds(graph.initializers, feeds))
    assert found["Conv"] == {F16} and found["ConvGrad"] == {F16}
    # float16 rounding may move a max-pool window's winner, so elements can differ; the
    # direction of every gradient must not
    for name in trainable:
        a, b = grads32[name].ravel(), grads16[name].ravel()
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99, name


# -- the loss scaler ----------------------------------------------------------------------------

def test_overflow_skips_the_step_and_halves_the_scale(digits):
    xt, yt, _, _ = digits
    model = Module(mlp())
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.1})
    before = {n: p.data().copy() for n, p in model.params.items()}
    scaler = LossScaler(init_scale=2.0 ** 40)  # the float16 backward overflows to inf
    loss, _ = model.train_step(xt[:32], yt[:32], trainer, precision="float16",
                               loss_scaler=scaler)
    assert np.isfinite(loss)
    assert scaler.scale == 2.0 ** 39 and scaler.skipped_steps == 1
    assert trainer.optimizer.num_update == 0
    for name, param in model.params.items():
        assert np.array_equal(param.data(), before[name]), name
    scaler.scale = 2.0 ** 10  # a sane scale trains again
    model.train_step(xt[:32], yt[:32], trainer, precision="float16")
    assert trainer.optimizer.num_update == 1 and model.loss_scaler is scaler
    assert not np.array_equal(model.params["w1"].data(), before["w1"])


def test_scaler_backs_off_and_grows_on_schedule():
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    for finite, expected in [(True, 1024), (True, 1024), (True, 2048), (False, 1024),
                             (True, 1024), (True, 1024), (True, 2048)]:
        scaler.update(finite)
        assert scaler.scale == expected
    fixed = LossScaler(init_scale=8.0, dynamic=False, growth_interval=1)
    fixed.update(False)
    fixed.update(True)
    assert fixed.scale == 8.0 and fixed.skipped_steps == 1


def test_scaler_unscales_in_place_and_flags_non_finite():
    scaler = LossScaler(init_scale=4.0)
    grads = {"a": np.array([4.0, 8.0], F32), "b": np.array([2.0], F32)}
    assert scaler.unscale(grads)
    assert grads["a"].tolist() == [1.0, 2.0] and grads["b"].dtype == F32
    assert not scaler.unscale({"a": np.array([1.0, np.inf], F32)})
    assert not scaler.unscale({"a": np.array([np.nan], F32)})


def test_all_finite_reads_each_device_once():
    from mixrt.runtime.training.mixed_precision import all_finite  # noqa: PLC0415
    assert all_finite([np.ones(3, F32), np.zeros((2, 2), np.float16)])
    assert not all_finite([np.ones(3, F32), np.array([1.0, np.nan], F32)])
    assert not all_finite([np.array([-np.inf], np.float16), np.ones(2, F32)])
    assert all_finite([])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_the_scaler_checks_a_gpu_steps_gradients_with_one_read():
    """A host read per gradient was a wait for the GPU per parameter in every step."""
    import cupy  # noqa: PLC0415
    scaler = LossScaler(init_scale=4.0)
    grads = {f"w{i}": cupy.full((3, i + 1), 8.0, F32) for i in range(12)}
    reads = getattr(getattr(cupy, "_core", None), "host_reads", None)
    before = reads() if reads else 0
    assert scaler.unscale(grads)
    if reads:  # the fake CuPy counts device-to-host reads
        assert reads() - before == 1
    assert float(grads["w3"][0, 0]) == 2.0
    grads["w7"][1, 2] = np.inf
    assert not scaler.unscale(grads)


@pytest.mark.parametrize("options", [{"init_scale": 0}, {"init_scale": float("inf")},
                                     {"growth_factor": 1.0}, {"backoff_factor": 1.5},
                                     {"growth_interval": 0}, {"growth_interval": 2.5}])
def test_scaler_rejects_bad_parameters(options):
    with pytest.raises(InputError, match="LossScaler"):
        LossScaler(**options)


def test_checkpoint_resumes_the_scaler_and_the_run(digits, tmp_path):
    xt, yt = digits[:2]

    def run(epochs, **options):
        mixrt_random.seed(1)
        model = Module(mlp())
        trainer = Trainer(model.params.trainable(), "adam", {"learning_rate": 0.01})
        model.fit(NDArrayIter(xt, yt, 50, shuffle=True, seed=5), epochs=epochs,
                  trainer=trainer, progress=False, precision="float16",
                  loss_scaler=LossScaler(init_scale=2.0 ** 20, growth_interval=7), **options)
        return model

    straight = run(3)
    run(2, checkpoint=tmp_path / "ckpt")
    resumed = run(3, resume=tmp_path / "ckpt.npz")
    assert resumed.loss_scaler.state_dict() == straight.loss_scaler.state_dict()
    assert straight.loss_scaler.scale != 2.0 ** 20  # it changed on the way
    for name, param in straight.params.items():
        assert np.array_equal(param.data(), resumed.params[name].data()), name


# -- the rewrite and its options ---------------------------------------------------------------

def test_deny_listed_ops_compute_in_float32_and_outputs_stay_float32():
    g = mlp(hidden=8)
    g.nodes += [Node("Softmax", ["out"], ["probs"], name="softmax", opset=17),
                Node("ReduceMean", ["h"], ["mean"], name="mean", opset=17, attributes={
                    "keepdims": 0})]
    g.outputs = [Value("out"), Value("probs"), Value("h"), Value("mean")]
    low = lower_precision(g, F16)
    found = _types_by_op(low, {"x": np.zeros((2, 64), F32)})
    assert found["Gemm"] == {F16} and found["Relu"] == {F16}
    assert found["Softmax"] == {F32} and found["ReduceMean"] == {F32}
    assert {"Softmax", "ReduceMean", "SoftmaxCrossEntropyLoss"} <= FLOAT32_OPS
    types = infer_types(low)
    assert all(np.dtype(types[name].dtype) == F32 for name in low.output_names)
    # "h" is an output (restored to float32) and read by Relu (which keeps the float16 value)
    relu = next(n for n in low.nodes if n.op_type == "Relu")
    assert np.dtype(types[relu.inputs[0]].dtype) == F16
    from mixrt.runtime.session import Session
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(F32)
    expected = Session(g, opt_level=0).run(None, {"x": x})
    for got, want in zip(Session(low, opt_level=1).run(None, {"x": x}), expected):
        assert got.dtype == F32
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_each_value_is_cast_once_and_float64_is_left_alone():
    g = mlp(hidden=8)
    g.initializers["c64"] = np.full(3, 0.1)
    g.nodes += [Node("Gemm", ["x", "w1", "b1"], ["h2"], name="fc1b", opset=17),  # x again
                Node("Add", ["h", "h2"], ["both"], name="both", opset=17),
                Node("Mul", ["c64", "c64"], ["sq64"], name="sq64", opset=17)]
    g.outputs = [Value("out"), Value("both"), Value("sq64")]
    low = lower_precision(g, F16)
    cast_inputs = [n.inputs[0] for n in low.nodes if n.op_type == "Cast"]
    assert sorted(cast_inputs) == sorted(["x", "w1", "b1", "w2", "b2", "out_float16",
                                          "both_float16"])
    found = _types_by_op(low, {"x": np.zeros((2, 64), F32)})
    assert found["Add"] == {F16} and found["Mul"] == {np.dtype(np.float64)}


def test_bad_precision_names_and_bfloat16_on_a_gpu_are_typed_errors():
    with pytest.raises(InputError, match="float16"):
        parse_precision("half")
    with pytest.raises(InputError, match="choose one of"):
        TrainingProgram(mlp(), softmax_cross_entropy("out"), ["w1"], precision="fp8")
    assert parse_precision("bfloat16").name == "bfloat16"
    with pytest.raises(UnsupportedOperatorError, match="CuPy has no bfloat16") as gpu:
        parse_precision("bfloat16", "gpu:0")
    assert gpu.value.dtype == "bfloat16"
    model = Module(mlp())
    with pytest.raises(InputError, match="precision"):
        model.fit(NDArrayIter(np.zeros((4, 64), F32), np.zeros(4, np.int64), 2),
                  precision="float8", progress=False)
    with pytest.raises(InputError, match="loss_scaler"):
        TrainingProgram(mlp(), softmax_cross_entropy("out"), ["w1"], precision="float16",
                        loss_scaler=2.0)


def test_float32_is_unchanged_and_scaling_is_optional():
    graph = mlp()
    plain = TrainingProgram(graph, softmax_cross_entropy("out"), ["w1"])
    assert plain.scaler is None and not any(n.op_type == "Cast" for n in plain.joint.graph.nodes)
    unscaled = TrainingProgram(graph, softmax_cross_entropy("out"), ["w1"],
                               precision="float16", loss_scaler=False)
    assert unscaled.scaler is None
    assert len(unscaled.joint.graph.inputs) == len(plain.joint.graph.inputs)


# -- GPU ----------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_float16_on_the_gpu_matches_the_cpu():
    pytest.importorskip("cupy")
    from mixrt.ops.device import gpu_available, to_host
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    rng = np.random.default_rng(4)
    graph = mlp()
    feeds = {"x": rng.standard_normal((16, 64)).astype(F32), "label": rng.integers(0, 10, 16)}
    trainable = ["w1", "b1", "w2", "b2"]
    cpu = TrainingProgram(graph, softmax_cross_entropy("out"), trainable, precision="float16")
    gpu = TrainingProgram(graph, softmax_cross_entropy("out"), trainable, precision="float16",
                          device="gpu")
    loss_cpu, _, grads_cpu = cpu.step(graph.initializers, feeds)
    loss_gpu, _, grads_gpu = gpu.step(graph.initializers, feeds)
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-3)
    for name in trainable:
        assert grads_gpu[name].dtype == F32
        scale = np.abs(grads_cpu[name]).max()
        np.testing.assert_allclose(to_host(grads_gpu[name]), grads_cpu[name], atol=5e-3 * scale)


def test_bfloat16_convolutions_are_written_at_the_opset_that_takes_them():
    """Conv and MaxPool take bfloat16 from opset 22 on; written at the CNN's opset they made
    a model the operand type check refuses, so no CNN could train in bfloat16."""
    import ml_dtypes
    from mixrt.runtime.passes.typecheck import check_operand_types
    mixrt_random.seed(3)
    graph = digits_cnn(channels=(4, 4), hidden=8)
    low = lower_precision(graph, ml_dtypes.bfloat16)
    opsets = {n.op_type: n.opset for n in low.nodes}
    assert opsets["Conv"] == opsets["MaxPool"] == 22 and opsets["Gemm"] == graph.opsets[""]
    check_operand_types(low)  # a valid model: the Session below would refuse it otherwise
    model = Module(graph)
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.1})
    x = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    loss, _ = model.train_step(x, np.arange(4), trainer, precision="bfloat16")
    assert np.isfinite(loss)


def _one_op_graph(op_type, opset, inputs: dict, attributes=None, constants=None) -> Graph:
    graph = Graph(name=op_type.lower(), opsets={"": opset})
    graph.inputs = [Value(n, TensorType(F32, shape)) for n, shape in inputs.items()]
    graph.initializers = dict(constants or {})
    graph.nodes = [Node(op_type, [*inputs, *graph.initializers], ["y"], name="op",
                        opset=opset, attributes=attributes or {})]
    graph.outputs = [Value("y")]
    return graph


@pytest.mark.parametrize("op_type, opset, precision, inputs, attributes, constants", [
    # Range takes no float16 or bfloat16 at any opset
    ("Range", 17, np.float16, {"start": ()}, {},
     {"limit": np.float32(3.0), "delta": np.float32(0.5)}),
    # AveragePool takes bfloat16 from 22, but 19 added dilations: 11 cannot simply move
    ("AveragePool", 11, "bfloat16", {"x": (1, 2, 4, 4)}, {"kernel_shape": [2, 2]}, {}),
    # Softmax-13 takes bfloat16, but its axis means something else than Softmax-11's
    ("Softmax", 11, "bfloat16", {"x": (2, 3, 4)}, {}, {}),
], ids=["range-float16", "average-pool-11-bfloat16", "softmax-11-bfloat16"])
def test_ops_that_cannot_take_the_low_type_stay_in_float32(op_type, opset, precision, inputs,
                                                            attributes, constants):
    """Casting their inputs down made a model the type check refuses; they now compute in
    float32, at their own opset, and give the float32 graph's result."""
    import ml_dtypes

    import mixrt
    from mixrt.runtime.passes.typecheck import check_operand_types
    dtype = ml_dtypes.bfloat16 if precision == "bfloat16" else precision
    graph = _one_op_graph(op_type, opset, inputs, attributes, constants)
    low = lower_precision(graph, dtype, float32_ops=frozenset())
    check_operand_types(low)
    node = next(n for n in low.nodes if n.op_type == op_type)
    assert node.opset == opset
    assert {infer_types(low)[name].dtype for name in node.inputs} == {F32}
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(F32) for n, shape in inputs.items()}
    np.testing.assert_array_equal(mixrt.Session(low).run(None, feeds)[0],
                                  mixrt.Session(graph).run(None, feeds)[0])


def _conv_bn_graph(opset: int) -> Graph:
    """conv - batch norm (training mode) - relu - conv, at ``opset``."""
    rng = np.random.default_rng(4)
    g = Graph(name="conv_bn", opsets={"": opset})
    g.inputs = [Value("x", TensorType(F32, ("N", 3, 6, 6)))]
    g.initializers.update({
        "w1": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(F32),
        "w2": (rng.standard_normal((10, 4, 6, 6)) * 0.1).astype(F32),
        "scale": np.ones(4, F32), "bias": np.zeros(4, F32),
        "mean": np.zeros(4, F32), "var": np.ones(4, F32)})

    def node(op_type, inputs, outputs, **attributes):
        return Node(op_type, inputs, outputs, name=outputs[0], opset=opset,
                    attributes=attributes)
    g.nodes = [node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
               node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"],
                    ["bn", "new_mean", "new_var"], training_mode=1),
               node("Relu", ["bn"], ["r"]),
               node("Conv", ["r", "w2"], ["c2"]),
               node("Flatten", ["c2"], ["logits"])]
    g.outputs = [Value("logits")]
    return g


def test_batch_norm_computes_in_float16_between_convolutions_without_casts():
    """BatchNormalization-15 takes a float16 X with float32 scale, bias and statistics (its
    kernels sum in float32), so a float16 convolution's output goes in and out of it with
    no Cast either side; the gradients keep float32's direction. Before opset 15 it cannot
    take mixed types and computes in float32 between casts, as before."""
    graph = _conv_bn_graph(17)
    trainable = ["w1", "w2", "scale", "bias"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 3, 6, 6)).astype(F32),
             "label": rng.integers(0, 10, 8)}
    params = {k: graph.initializers[k] for k in trainable}
    full = TrainingProgram(graph, softmax_cross_entropy("logits"), trainable)
    half = TrainingProgram(graph, softmax_cross_entropy("logits"), trainable,
                           precision="float16")
    _, _, grads32 = full.step(params, feeds)
    _, _, grads16 = half.step(params, feeds)
    joint = half.joint.graph
    found = _types_by_op(joint, half._feeds(params, feeds))
    assert found["BatchNormalization"] == {F16} and found["BatchNormalizationGrad"] == {F16}
    producers = {out: n for n in joint.nodes for out in n.outputs}
    bn = next(n for n in joint.nodes if n.op_type == "BatchNormalization")
    assert producers[bn.inputs[0]].op_type == "Conv"
    assert all(n.op_type != "Cast" for n in joint.nodes if bn.outputs[0] in n.inputs)
    for name in trainable:
        a, b = grads32[name].ravel(), grads16[name].ravel()
        assert grads16[name].dtype == F32
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99, name
    older = lower_precision(_conv_bn_graph(14), F16)
    assert _types_by_op(older, {"x": feeds["x"]})["BatchNormalization"] == {F32}
